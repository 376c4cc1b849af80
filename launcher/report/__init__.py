"""`mgpu report`: a run's story as one self-contained HTML page and a Chrome trace (Perfetto).

A stage after supervise/: it reads only a run's folder (run.json and the names and sizes of its
logs), as `mgpu status` reads it. `story.py` turns the record into what is shown (pure, every
value checked and bounded), `page.py` and `svg.py` draw it as HTML with inline SVG (no script,
style or font from the network), `trace.py` writes the timeline as Chrome trace events.
"""

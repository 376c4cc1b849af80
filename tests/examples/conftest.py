"""Tests that run the programs in examples/ under the real `mgpu launch`."""

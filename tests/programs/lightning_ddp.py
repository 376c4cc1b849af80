"""PyTorch Lightning's Trainer with strategy="ddp" on CPU: a tiny linear model, a few steps, the same
data on every run. Each process prints its place in the job as Lightning sees it and the sum of its
weights at the end, which DDP keeps equal on every process.

Usage: python lightning_ddp.py DEVICES NUM_NODES
"""

import sys

import lightning as L
import torch


class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, _):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main() -> None:
    devices, num_nodes = int(sys.argv[1]), int(sys.argv[2])
    torch.manual_seed(0)
    x = torch.randn(64, 4)
    data = torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True))
    trainer = L.Trainer(accelerator="cpu", devices=devices, num_nodes=num_nodes, strategy="ddp", max_steps=4,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    model = Tiny()
    trainer.fit(model, torch.utils.data.DataLoader(data, batch_size=8))
    weights = sum(p.detach().sum().item() for p in model.parameters())
    print(f"lightning rank {trainer.global_rank} of {trainer.world_size}, node {trainer.node_rank}, "
          f"local rank {trainer.local_rank}: weights sum {weights:.6f}", flush=True)
    # Every rank leaves together: Lightning leaves the process group up after fit, and tearing it down
    # at interpreter exit while another rank still uses it can abort the process (std::terminate).
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()

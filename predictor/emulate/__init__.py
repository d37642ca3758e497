"""Libraries and CUDA kernels as they allocate on the target, run under capture.

One module per library feature: `attention` and `flash_attn` (attention kernels), `kernels`
(CUDA kernel choices on fake CPU tensors), `peft` (any peft method), `lora` (target names)
and `quant_lora` (peft over a quantised base), `quant`
(bitsandbytes storage), `optim8bit` (bitsandbytes' 8-bit AdamW), `parallel` (DDP, FSDP2,
HSDP, ZeRO on a fake process group), `loss` (torchtune's chunked cross entropy).
"""

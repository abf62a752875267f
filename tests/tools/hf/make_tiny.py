"""Tiny Hugging Face test inputs: for `model: {name: hf}`, the loss mask and `gpurun export`.

Run it with the Python of the Hugging Face tools (scripts/install-deps.sh --print-hf-python):

  make_tiny.py model DIR [--arch llama|mistral|qwen2] [--dtype float32|bfloat16] [--tied]
                         [--rope-scaling none|llama3|linear] [--rope-theta F] [--rope-factor F]
                         [--rope-original-max N] [--layers 2] [--hidden 64] [--heads 4]
                         [--kv-heads 2] [--intermediate 128] [--vocab 512] [--max-positions 256]
                         [--sliding-window N] [--std F] [--max-shard-size 40KB]
                         [--config-style v5|v4] [--seed 0]
      A random causal LM, written by transformers' save_pretrained into DIR (config.json,
      generation_config.json, model.safetensors, or model-0000k-of-0000n.safetensors with
      model.safetensors.index.json when --max-shard-size splits it). transformers 5 writes
      "rope_parameters" and "dtype" in config.json; --config-style v4 rewrites them as the
      configs of most published models have them, and transformers 4 wrote them: "rope_theta",
      "rope_scaling" (null without scaling) and "torch_dtype". transformers 5 reads either.

  make_tiny.py tokens [--tokens OUT.bin] [--eval-tokens VAL.bin] [--n-tokens N]
                      [--n-eval-tokens N] [--token-dtype uint16|uint32] [--vocab 512]
                      [--mask OUT.mask] [--eval-mask VAL.mask] [--context T]
                      [--mask-mode first-half|random] [--mask-prob P] [--seed 0]
      Random token ids in [0, vocab), raw little-endian (nanoGPT's train.bin/val.bin layout,
      gpurun's data.name tokens), and loss masks for them (data.mask_path, data.eval_mask_path):
      one uint8 per token of the token file, 1 where that token counts as a target. first-half:
      0 for the first context // 2 tokens of every block of --context tokens (offsets i * context,
      the windows gpurun's eval reads), else 1; random: 1 with probability --mask-prob.

  make_tiny.py adapter --model DIR OUT [--r 4] [--alpha 8] [--targets q_proj,v_proj]
                       [--std F] [--seed 0]
      A LoRA adapter for the model in DIR made by peft (get_peft_model, save_pretrained), its A
      and B random (peft starts B at zero, which would make the adapter change nothing).

Every weight is random and seeded: the same arguments give the same bytes. The weights are drawn
here, in named_parameters order, not by the model's own init: matrices normal with std --std
(default 1 / sqrt(hidden)), biases normal with std 0.1, RMSNorm weights 1 + 0.1 * normal. With
transformers' 0.02 at hidden 64, q.k is about 0.03 and attention nearly uniform, so a wrong RoPE
or head layout would hardly move the loss; and norm weights of exactly 1 would let a missing or
misplaced norm weight pass.
"""
import argparse
import json
import math
import os
import sys

import numpy as np


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)

    m = sub.add_parser("model", help="a random causal LM, save_pretrained into DIR")
    m.add_argument("dir")
    m.add_argument("--arch", choices=["llama", "mistral", "qwen2"], default="llama")
    m.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    m.add_argument("--tied", action="store_true",
                   help="tie_word_embeddings: lm_head is embed_tokens")
    m.add_argument("--rope-scaling", choices=["none", "llama3", "linear"], default="none")
    m.add_argument("--rope-theta", type=float, default=10000.0)
    m.add_argument("--rope-factor", type=float, default=4.0,
                   help="llama3 and linear scaling's factor")
    m.add_argument("--rope-original-max", type=int, default=64,
                   help="llama3's original_max_position_embeddings (64: with head_dim 16 some "
                        "frequencies are kept, some scaled, some smoothed)")
    m.add_argument("--layers", type=int, default=2)
    m.add_argument("--hidden", type=int, default=64)
    m.add_argument("--heads", type=int, default=4)
    m.add_argument("--kv-heads", type=int, default=2)
    m.add_argument("--intermediate", type=int, default=128)
    m.add_argument("--vocab", type=int, default=512)
    m.add_argument("--max-positions", type=int, default=256)
    m.add_argument("--sliding-window", type=int, default=None,
                   help="mistral only; default none (full attention, as gpurun computes it)")
    m.add_argument("--std", type=float, default=None, help="matrices' std (default 1/sqrt(hidden))")
    m.add_argument("--max-shard-size", default=None,
                   help='save_pretrained\'s max_shard_size, e.g. "40KB" for several shards')
    m.add_argument("--config-style", choices=["v5", "v4"], default="v5",
                   help="config.json's rope and dtype keys: transformers 5's or 4's")
    m.add_argument("--seed", type=int, default=0)

    t = sub.add_parser("tokens", help="random token files and loss masks")
    t.add_argument("--tokens", help="the training token file to write")
    t.add_argument("--eval-tokens", help="the eval token file to write")
    t.add_argument("--n-tokens", type=int, default=4096)
    t.add_argument("--n-eval-tokens", type=int, default=None, help="default --n-tokens")
    t.add_argument("--token-dtype", choices=["uint16", "uint32"], default="uint16")
    t.add_argument("--vocab", type=int, default=512)
    t.add_argument("--mask", help="the mask of --tokens to write")
    t.add_argument("--eval-mask", help="the mask of --eval-tokens to write")
    t.add_argument("--context", type=int, default=None, help="first-half's block length")
    t.add_argument("--mask-mode", choices=["first-half", "random"], default="first-half")
    t.add_argument("--mask-prob", type=float, default=0.5, help="random: P(mask byte is 1)")
    t.add_argument("--seed", type=int, default=0)

    a = sub.add_parser("adapter", help="a random LoRA adapter for a model, by peft")
    a.add_argument("out")
    a.add_argument("--model", required=True)
    a.add_argument("--r", type=int, default=4)
    a.add_argument("--alpha", type=float, default=8.0)
    a.add_argument("--targets", default="q_proj,v_proj", help="comma-separated module names")
    a.add_argument("--std", type=float, default=0.1, help="A's and B's std")
    a.add_argument("--seed", type=int, default=0)

    args = p.parse_args(argv)
    if args.command == "tokens":
        if not (args.tokens or args.eval_tokens):
            p.error("tokens: name --tokens and/or --eval-tokens")
        if args.mask and not args.tokens or args.eval_mask and not args.eval_tokens:
            p.error("tokens: --mask needs --tokens, --eval-mask needs --eval-tokens")
        if (args.mask or args.eval_mask) and args.mask_mode == "first-half" and not args.context:
            p.error("tokens: --mask-mode first-half needs --context")
        if args.token_dtype == "uint16" and args.vocab > 65536:
            p.error("tokens: --vocab > 65536 needs --token-dtype uint32")
    return args


def rope_parameters(args):
    """transformers 5's rope_parameters (it replaced rope_theta and rope_scaling)."""
    rope = {"rope_type": "default", "rope_theta": args.rope_theta}
    if args.rope_scaling == "linear":
        rope.update(rope_type="linear", factor=args.rope_factor)
    elif args.rope_scaling == "llama3":
        rope.update(rope_type="llama3", factor=args.rope_factor, low_freq_factor=1.0,
                    high_freq_factor=4.0, original_max_position_embeddings=args.rope_original_max)
    return rope


def make_model(args):
    import torch
    import transformers

    common = dict(
        vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
        num_hidden_layers=args.layers, num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads, max_position_embeddings=args.max_positions,
        tie_word_embeddings=args.tied, rope_parameters=rope_parameters(args),
    )
    if args.arch == "llama":
        config = transformers.LlamaConfig(**common)
        model_class = transformers.LlamaForCausalLM
    elif args.arch == "mistral":
        # Mistral's default sliding_window (4096) would be a no-op at these lengths anyway; None
        # says so in config.json.
        config = transformers.MistralConfig(**common, sliding_window=args.sliding_window)
        model_class = transformers.MistralForCausalLM
    else:
        # Qwen2: q_proj, k_proj and v_proj have biases (not o_proj); no sliding window unless
        # use_sliding_window.
        config = transformers.Qwen2Config(**common, use_sliding_window=False)
        model_class = transformers.Qwen2ForCausalLM

    torch.manual_seed(args.seed)
    model = model_class(config).to(torch.float32)
    std = args.std if args.std is not None else 1.0 / math.sqrt(args.hidden)
    gen = torch.Generator().manual_seed(args.seed)
    with torch.no_grad():
        # named_parameters() lists a tied lm_head.weight once, as model.embed_tokens.weight.
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=gen, dtype=torch.float32)
            if "norm" in name:  # input_layernorm, post_attention_layernorm, model.norm
                param.copy_(1.0 + 0.1 * noise)
            elif name.endswith(".bias"):
                param.copy_(0.1 * noise)
            else:
                param.copy_(std * noise)
    if args.tied:
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    model = model.to(getattr(torch, args.dtype))
    kwargs = {"max_shard_size": args.max_shard_size} if args.max_shard_size else {}
    model.save_pretrained(args.dir, **kwargs)
    if args.config_style == "v4":
        v4_config(os.path.join(args.dir, "config.json"))
    print(f"make_tiny: {args.arch} ({sum(p.numel() for p in model.parameters())} parameters, "
          f"{args.dtype}) in {args.dir}")


def v4_config(path):
    """Rewrites transformers 5's rope_parameters and dtype as transformers 4 wrote them."""
    with open(path) as f:
        config = json.load(f)
    rope = config.pop("rope_parameters")
    config["rope_theta"] = rope.pop("rope_theta")
    config["rope_scaling"] = None if rope["rope_type"] == "default" else rope
    config["torch_dtype"] = config.pop("dtype")
    with open(path, "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
        f.write("\n")


def mask_of(n, args, rng):
    if args.mask_mode == "first-half":
        return ((np.arange(n) % args.context) >= args.context // 2).astype(np.uint8)
    return (rng.random(n) < args.mask_prob).astype(np.uint8)


def make_tokens(args):
    # Separate streams for the two files (and their masks), so that writing one file alone gives
    # the same bytes as writing both.
    streams = np.random.SeedSequence(args.seed).spawn(4)
    dtype = np.dtype("<u2" if args.token_dtype == "uint16" else "<u4")
    n_eval = args.n_eval_tokens if args.n_eval_tokens is not None else args.n_tokens
    for path, n, ids_seed, mask_path, mask_seed in (
        (args.tokens, args.n_tokens, streams[0], args.mask, streams[1]),
        (args.eval_tokens, n_eval, streams[2], args.eval_mask, streams[3]),
    ):
        if not path:
            continue
        ids = np.random.default_rng(ids_seed).integers(0, args.vocab, size=n, dtype=np.int64)
        ids.astype(dtype).tofile(path)
        line = f"make_tiny: {n} {args.token_dtype} tokens in {path}"
        if mask_path:
            mask = mask_of(n, args, np.random.default_rng(mask_seed))
            mask.tofile(mask_path)
            line += f", mask ({args.mask_mode}, {int(mask.sum())} ones) in {mask_path}"
        print(line)


def make_adapter(args):
    import peft
    import torch
    import transformers

    torch.manual_seed(args.seed)
    base = transformers.AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    config = peft.LoraConfig(r=args.r, lora_alpha=args.alpha, lora_dropout=0.0,
                             target_modules=args.targets.split(","), task_type="CAUSAL_LM")
    model = peft.get_peft_model(base, config)
    gen = torch.Generator().manual_seed(args.seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_" in name:
                param.copy_(args.std * torch.randn(param.shape, generator=gen))
    model.save_pretrained(args.out)
    print(f"make_tiny: LoRA r={args.r} alpha={args.alpha} on {args.targets} in {args.out}")


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.command != "tokens":
        import warnings

        import transformers

        transformers.utils.logging.disable_progress_bar()  # a test's log wants the one line
        # peft 0.21.2 calls a transformers 5.25 method that transformers deprecates.
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing",
                                category=FutureWarning)
    {"model": make_model, "tokens": make_tokens, "adapter": make_adapter}[args.command](args)


if __name__ == "__main__":
    main()

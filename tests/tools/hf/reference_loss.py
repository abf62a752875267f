"""The eval loss gpurun should report for a Hugging Face model on a tokens data set (transformers).

Run it with the Python of the Hugging Face tools (scripts/install-deps.sh --print-hf-python):

  reference_loss.py --model DIR --tokens FILE --context C [--token-dtype uint16|uint32]
                    [--mask FILE] [--samples N] [--eval-fraction F] [--adapter DIR]
                    [--dtype float32|bfloat16|auto] [--attn sdpa|eager] [--batch B]
      Prints one JSON line: {"loss", "counted", "samples", "correct", "accuracy"}.

  reference_loss.py --model DIR --check-keys OTHER_DIR [--values]
      Prints one JSON line saying whether the two folders' safetensors files (model*.safetensors
      or adapter_model.safetensors, sharded or not) hold the same tensor names with the same
      dtypes and shapes ("identical"), and what differs; --values adds the largest absolute
      difference of the common tensors of one shape ("max_abs_diff", compared in float64).

The data are gpurun's eval set of data.name tokens (runner/src/data/tokens_dataset.cpp): the
sequential windows of the token file, sample i reading tokens [i*C, i*C + C] (inputs its first C,
targets its last C), (T - 1) // C samples for T tokens, the first --samples of them when given.
T counts the ids after an llm.c header (magic 20240520: uint16, 20240801: uint32), which names its
own width; a raw file's width is --token-dtype. --eval-fraction F reads the last round(F * T)
tokens of the file instead, as gpurun does without data.eval_path and without a val.bin beside
data.path.

The mask (data.mask_path / data.eval_mask_path) is one uint8 per token of the file (header not
counted), indexed by the token's own position in the file: a target token whose byte is 0 is not
counted (label -100).

"loss" is the mean cross entropy over every counted target of every window: transformers
computes each batch's sum (labels with -100, num_items_in_batch=1, so that its loss is the sum
rather than the mean), and the sums and counts are added here, over all batches. That is
gpurun's eval_loss (runner/src/model/micro_batch_step.cpp, EvalSums::loss): without a mask,
each eval batch's mean weighted by its samples, over the samples, which is the mean over all
positions since every window has C targets; with one, each batch's mean times its counted
targets, over the counted targets of all batches and ranks: a mean of batch means would differ.
"counted": the targets that count; "correct" / "accuracy": argmax predictions equal to a counted
target, and that over "counted" (gpurun's eval accuracy).

--dtype float32 (default) loads and runs the model in float32 whatever it was saved in; auto runs
it in the dtype config.json names. --adapter loads a PEFT adapter onto the model
(PeftModel.from_pretrained), unmerged; the adapter's tensor names must be exactly those peft
would save for it (peft itself only warns about missing ones and ignores unknown ones).
"""
import argparse
import glob
import json
import math
import os
import sys

import numpy as np

LLMC_HEADER_INTS = 256
LLMC_MAGIC = {20240520: "<u2", 20240801: "<u4"}  # llm.c's GPT-2 (version 1), Llama 3 (version 7)


def fail(message):
    sys.exit(f"reference_loss: {message}")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True,
                   help="a Hugging Face model folder (config.json, *.safetensors)")
    p.add_argument("--adapter", help="a PEFT adapter folder to load onto --model")
    p.add_argument("--tokens", help="the eval token file")
    p.add_argument("--token-dtype", choices=["uint16", "uint32"], default="uint16",
                   help="a raw file's id width (an llm.c header names its own)")
    p.add_argument("--context", type=int, help="data.context")
    p.add_argument("--mask", help="the token file's mask, one uint8 per token")
    p.add_argument("--samples", type=int, default=0,
                   help="only the first N windows (data.eval_samples)")
    p.add_argument("--eval-fraction", type=float, default=None,
                   help="read the last round(F * T) tokens only (data.eval_fraction)")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "auto"], default="float32")
    p.add_argument("--attn", choices=["sdpa", "eager"], default="sdpa")
    p.add_argument("--batch", type=int, default=8,
                   help="windows a forward pass (the result does not depend on it)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--check-keys", metavar="OTHER_DIR",
                   help="compare --model's safetensors with OTHER_DIR's")
    p.add_argument("--values", action="store_true", help="--check-keys: also compare the values")
    args = p.parse_args(argv)
    if not args.check_keys and not (args.tokens and args.context):
        p.error("--tokens and --context are needed (or --check-keys)")
    if args.context is not None and args.context < 1:
        p.error("--context must be >= 1")
    return args


def read_tokens(path, raw_dtype):
    """The file's ids (after any llm.c header), as a read-only memmap."""
    header = np.fromfile(path, dtype="<i4", count=LLMC_HEADER_INTS)
    if len(header) == LLMC_HEADER_INTS and int(header[0]) in LLMC_MAGIC:
        dtype = np.dtype(LLMC_MAGIC[int(header[0])])
        ids = np.memmap(path, dtype=dtype, mode="r", offset=LLMC_HEADER_INTS * 4)
        if len(ids) != int(header[2]):
            fail(f"{path}: its llm.c header says {int(header[2])} tokens, it holds {len(ids)}")
        return ids
    dtype = np.dtype("<u2" if raw_dtype == "uint16" else "<u4")
    if os.path.getsize(path) % dtype.itemsize:
        fail(f"{path} holds no whole number of {raw_dtype} ids")
    return np.memmap(path, dtype=dtype, mode="r")


def windows(args):
    """(the windows' start offsets in the file, the file's ids, its mask or None)."""
    ids = read_tokens(args.tokens, args.token_dtype)
    total = len(ids)
    begin = 0
    if args.eval_fraction is not None:
        begin = total - int(math.floor(args.eval_fraction * total + 0.5))  # C's llround
    n = (total - begin - 1) // args.context if total - begin > args.context else 0
    if args.samples:
        if args.samples > n:
            fail(f"--samples {args.samples}, but {args.tokens} has {n} windows of {args.context}")
        n = args.samples
    if n == 0:
        fail(f"{args.tokens} has fewer than --context + 1 = {args.context + 1} tokens")
    mask = None
    if args.mask:
        mask = np.memmap(args.mask, dtype=np.uint8, mode="r")
        if len(mask) != total:
            fail(f"{args.mask} has {len(mask)} bytes, {args.tokens} {total} tokens")
    return begin + np.arange(n, dtype=np.int64) * args.context, ids, mask


def load_model(args):
    import torch
    import transformers

    dtype = "auto" if args.dtype == "auto" else getattr(torch, args.dtype)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        args.model, dtype=dtype, attn_implementation=args.attn)
    if args.adapter:
        import peft
        from safetensors import safe_open

        model = peft.PeftModel.from_pretrained(model, args.adapter)
        # peft only warns about adapter tensors it expected and did not find (they keep their
        # initial values) and says nothing of tensors it does not know: a test must fail on
        # either, so the file's names are held to those peft itself would save for this model.
        path = os.path.join(args.adapter, "adapter_model.safetensors")
        with safe_open(path, framework="pt") as f:
            found = set(f.keys())
        expected = set(peft.get_peft_model_state_dict(model))
        if found != expected:
            fail(f"{path}: tensors peft expects and did not find: {sorted(expected - found)}; "
                 f"found and not expected: {sorted(found - expected)}")
    return model.to(args.device).eval()


def evaluate(args):
    import torch

    starts, ids, mask = windows(args)
    model = load_model(args)
    vocab = model.config.vocab_size
    C = args.context
    # Per batch: the sum of its counted targets' losses, their count, the correct predictions.
    loss_sums, counts, correct = [], [], []
    with torch.no_grad():
        for first in range(0, len(starts), args.batch):
            chunk = starts[first:first + args.batch]
            rows = np.stack([np.asarray(ids[s:s + C + 1], dtype=np.int64) for s in chunk])
            if rows.max() >= vocab:
                fail(f"{args.tokens} has id {int(rows.max())} >= the model's vocab_size {vocab}")
            input_ids = torch.from_numpy(rows).to(args.device)
            labels = input_ids.clone()
            if mask is not None:
                keep = np.stack([mask[s:s + C + 1] for s in chunk]) != 0
                labels[torch.from_numpy(~keep).to(args.device)] = -100
            # The model shifts the labels itself: position j's logits are scored against label
            # j + 1, so label 0 is never a target and the last position has none (C + 1 tokens
            # in; the logits at 0..C-1 see tokens 0..C-1 only, as gpurun's C inputs). With
            # num_items_in_batch=1 its loss is the batch's sum, not its mean.
            out = model(input_ids=input_ids, labels=labels, num_items_in_batch=1)
            target = labels[:, 1:]
            counted = target != -100
            predicted = out.logits[:, :-1].argmax(-1)
            loss_sums.append(float(out.loss))
            counts.append(int(counted.sum()))
            correct.append(int((predicted.eq(target) & counted).sum()))
    counted = sum(counts)
    result = {
        "loss": math.fsum(loss_sums) / counted if counted else float("nan"),
        "counted": counted,
        "samples": len(starts),
        "correct": sum(correct),
        "accuracy": sum(correct) / counted if counted else float("nan"),
    }
    return result


def safetensors_entries(folder):
    """{name: (dtype, shape, file)} of every *.safetensors in folder."""
    from safetensors import safe_open

    files = sorted(glob.glob(os.path.join(folder, "*.safetensors")))
    if not files:
        fail(f"no *.safetensors in {folder}")
    entries = {}
    for path in files:
        with safe_open(path, framework="pt") as f:
            for name in f.keys():
                s = f.get_slice(name)
                entries[name] = (s.get_dtype(), list(s.get_shape()), path)
    return entries


def check_keys(args):
    from safetensors import safe_open

    a, b = safetensors_entries(args.model), safetensors_entries(args.check_keys)
    common = sorted(set(a) & set(b))
    result = {
        "only_in_model": sorted(set(a) - set(b)),
        "only_in_other": sorted(set(b) - set(a)),
        "dtype_differs": {k: [a[k][0], b[k][0]] for k in common if a[k][0] != b[k][0]},
        "shape_differs": {k: [a[k][1], b[k][1]] for k in common if a[k][1] != b[k][1]},
        "tensors": [len(a), len(b)],
    }
    result["identical"] = not any(result[k] for k in ("only_in_model", "only_in_other",
                                                      "dtype_differs", "shape_differs"))
    if args.values:
        worst, worst_name = 0.0, None
        for k in common:
            if a[k][1] != b[k][1]:
                continue
            with safe_open(a[k][2], framework="pt") as fa, safe_open(b[k][2], framework="pt") as fb:
                ta, tb = fa.get_tensor(k).double(), fb.get_tensor(k).double()
            diff = (ta - tb).abs().max().item() if ta.numel() else 0.0
            if diff > worst or worst_name is None:
                worst, worst_name = diff, k
        result["max_abs_diff"] = worst
        result["max_abs_diff_tensor"] = worst_name
    return result


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    import warnings

    import transformers

    transformers.utils.logging.disable_progress_bar()  # one JSON line on stdout; a clean log
    # peft 0.21.2 calls a transformers 5.25 method that transformers deprecates: not ours to fix.
    warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing",
                            category=FutureWarning)
    print(json.dumps(check_keys(args) if args.check_keys else evaluate(args)))


if __name__ == "__main__":
    main()

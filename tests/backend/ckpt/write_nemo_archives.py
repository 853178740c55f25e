"""NeMo .nemo archives as NeMo 1.x (NeMo-Megatron-Launcher 23.07 and 23.08) saves a GPT, for
nemo_archive_test.cpp.

usage: write_nemo_archives.py DIR

Written with Python's tarfile and PyTorch itself, in the structure of NeMo's
save_restore_connector.py (NLPSaveRestoreConnector.save_to): the model's files in a directory,
added with tarfile.add(directory, arcname=".") to an uncompressed ("w:") archive, so the
members are "./model_config.yaml", "./model_weights.ckpt" and each tokenizer file as
"./<uuid4 hex>_<its name>", which the config names "nemo:<uuid4 hex>_<its name>".
model_weights.ckpt is torch.save(model.state_dict()) of the legacy MegatronGPTModel
(mcore_gpt false): "model.language_model.embedding.word_embeddings.weight", ...,
"model.language_model.encoder.layers.N.self_attention.query_key_value.weight" (per head
[q, k, v] rows), ".mlp.dense_h_to_4h" and, under SwiGLU, ".mlp.dense_h_to_4h_2" (the gate's and
the up projection's rows), RoPE's persistent buffer "model.language_model.rotary_pos_emb.inv_freq",
in the modules' registration order. model_config.yaml is the `model` section with NeMo's keys,
`target` and `nemo_version`. Into DIR:

  gpt.nemo        GPT-2-like (layernorm, learned positions, gelu, biases, tied embeddings),
                  GPT2BPETokenizer with its vocab.json and merges.txt packed in
  llama.nemo      Llama-like (rmsnorm, rope with inv_freq, swiglu, no biases, untied), NeMo's
                  SentencePiece tokenizer (library sentencepiece, type null) packed in;
                  compressed ("w:gz"), which NeMo's restore also opens
  mcore.nemo      gpt.nemo's config with mcore_gpt: true
  tp2.nemo        gpt.nemo's files at tensor-parallel size 2 (mp_rank_00/, mp_rank_01/)
  dotdot.nemo     a member named ../escaped
  symlink.nemo    a member that is a symbolic link
  expected_gpt.json, expected_llama.json
                  every tensor by this backend's names (Megatron core's), its shape and values
"""
import collections
import io
import json
import os
import shutil
import sys
import tarfile
import tempfile

import torch
import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "..", "data")
UUIDS = iter(["0123456789abcdef0123456789abcdef", "fedcba9876543210fedcba9876543210",
              "00112233445566778899aabbccddeeff"])


def gpt_config():
    return dict(num_layers=2, hidden_size=16, ffn_hidden_size=64, num_attention_heads=4,
                encoder_seq_length=8, max_position_embeddings=8, normalization="layernorm",
                activation="gelu", bias=True, position_embedding_type="learned_absolute",
                share_embeddings_and_output_weights=True)


def llama_config():
    return dict(num_layers=2, hidden_size=16, ffn_hidden_size=24, num_attention_heads=4,
                encoder_seq_length=8, max_position_embeddings=8, normalization="rmsnorm",
                activation="swiglu", bias=False, position_embedding_type="rope",
                rotary_percentage=1.0, share_embeddings_and_output_weights=False)


def padded(vocab, divisor=128):
    return -(-vocab // divisor) * divisor


def state_dict(c, vocab_rows, seed):
    """The legacy GPTModel's state dict (NeMo's names, registration order) and the same tensors
    by this backend's names."""
    generator = torch.Generator().manual_seed(seed)
    h, f = c["hidden_size"], c["ffn_hidden_size"]
    nemo = collections.OrderedDict()
    ours = collections.OrderedDict()

    def tensor(*shape):
        return torch.randn(*shape, generator=generator) * 0.5

    def add(nemo_name, our_name, *shape):
        t = tensor(*shape)
        nemo["model." + nemo_name] = t
        if our_name is not None:
            ours[our_name] = t
        return t

    lm = "language_model."
    add(lm + "embedding.word_embeddings.weight", "embedding.word_embeddings.weight", vocab_rows, h)
    if c["position_embedding_type"] == "learned_absolute":
        add(lm + "embedding.position_embeddings.weight", "embedding.position_embeddings.weight",
            c["max_position_embeddings"], h)
    else:
        dim = h // c["num_attention_heads"]
        nemo["model." + lm + "rotary_pos_emb.inv_freq"] = \
            1.0 / (10000 ** (torch.arange(0, dim, 2).float() / dim))

    def norm(nemo_name, our_name):
        add(nemo_name + ".weight", our_name + ".weight", h)
        if c["normalization"] == "layernorm":
            add(nemo_name + ".bias", our_name + ".bias", h)

    def linear(nemo_name, our_name, rows, columns):
        add(nemo_name + ".weight", our_name + ".weight", rows, columns)
        if c["bias"]:
            add(nemo_name + ".bias", our_name + ".bias", rows)

    for layer in range(c["num_layers"]):
        n = f"{lm}encoder.layers.{layer}."
        o = f"decoder.layers.{layer}."
        norm(n + "input_layernorm", o + "input_layernorm")
        linear(n + "self_attention.query_key_value", o + "self_attention.linear_qkv", 3 * h, h)
        linear(n + "self_attention.dense", o + "self_attention.linear_proj", h, h)
        norm(n + "post_attention_layernorm", o + "pre_mlp_layernorm")
        if c["activation"] == "swiglu":
            gate = add(n + "mlp.dense_h_to_4h.weight", None, f, h)
            up = add(n + "mlp.dense_h_to_4h_2.weight", None, f, h)
            ours[o + "mlp.linear_fc1.weight"] = torch.cat([gate, up])
        else:
            linear(n + "mlp.dense_h_to_4h", o + "mlp.linear_fc1", f, h)
        linear(n + "mlp.dense_4h_to_h", o + "mlp.linear_fc2", h, f)
    norm(lm + "encoder.final_layernorm", "decoder.final_layernorm")
    if not c["share_embeddings_and_output_weights"]:
        add(lm + "output_layer.weight", "output_layer.weight", vocab_rows, h)
    return nemo, ours


def model_config(c, tokenizer, **more):
    config = dict(micro_batch_size=4, global_batch_size=8, tensor_model_parallel_size=1,
                  pipeline_model_parallel_size=1, init_method_std=0.02, hidden_dropout=0.0,
                  attention_dropout=0.0, kv_channels=None, apply_query_key_layer_scaling=True,
                  layernorm_epsilon=1e-5, make_vocab_size_divisible_by=128, pre_process=True,
                  post_process=True, persist_layer_norm=True, num_query_groups=None,
                  tokenizer=tokenizer, megatron_amp_O2=True, mcore_gpt=False,
                  transformer_engine=False, precision=16,
                  target="nemo.collections.nlp.models.language_modeling.megatron_gpt_model."
                         "MegatronGPTModel", nemo_version="1.20.0")
    config.update(c)
    config.update(more)
    return config


def save_nemo(path, config, weights, artifacts, mode="w:", rank_directories=None):
    """NLPSaveRestoreConnector.save_to: the files into a directory, tarred with arcname "."."""
    directory = tempfile.mkdtemp()
    try:
        with open(os.path.join(directory, "model_config.yaml"), "w") as out:
            yaml.safe_dump(config, out, sort_keys=False)
        if rank_directories:
            for name in rank_directories:
                os.makedirs(os.path.join(directory, name))
                torch.save(weights, os.path.join(directory, name, "model_weights.ckpt"))
        else:
            torch.save(weights, os.path.join(directory, "model_weights.ckpt"))
        for name, source in artifacts:
            shutil.copyfile(source, os.path.join(directory, name))
        with tarfile.open(path, mode) as tar:
            tar.add(directory, arcname=".")
    finally:
        shutil.rmtree(directory)


def expected(path, ours):
    with open(path, "w") as out:
        json.dump({n: {"shape": list(t.shape), "values": t.flatten().tolist()}
                   for n, t in ours.items()}, out)


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)

    vocab = f"{next(UUIDS)}_vocab.json"
    merges = f"{next(UUIDS)}_merges.txt"
    gpt_tokenizer = dict(library="megatron", type="GPT2BPETokenizer", model=None, delimiter=None,
                         vocab_file="nemo:" + vocab, merge_file="nemo:" + merges)
    gpt_artifacts = [(vocab, os.path.join(DATA, "gpt2-vocab.json")),
                     (merges, os.path.join(DATA, "gpt2-merges.txt"))]
    gpt_nemo, gpt_ours = state_dict(gpt_config(), padded(50257), 1)
    save_nemo(os.path.join(out, "gpt.nemo"), model_config(gpt_config(), gpt_tokenizer), gpt_nemo,
              gpt_artifacts)
    expected(os.path.join(out, "expected_gpt.json"), gpt_ours)

    piece = f"{next(UUIDS)}_tokenizer.model"
    llama_tokenizer = dict(library="sentencepiece", type=None, model="nemo:" + piece,
                           delimiter=None, vocab_file=None, merge_file=None,
                           sentencepiece_legacy=False)
    llama_nemo, llama_ours = state_dict(llama_config(), padded(500), 2)
    save_nemo(os.path.join(out, "llama.nemo"), model_config(llama_config(), llama_tokenizer),
              llama_nemo, [(piece, os.path.join(DATA, "sentencepiece_bpe.model"))], mode="w:gz")
    expected(os.path.join(out, "expected_llama.json"), llama_ours)

    save_nemo(os.path.join(out, "mcore.nemo"),
              model_config(gpt_config(), gpt_tokenizer, mcore_gpt=True), gpt_nemo, gpt_artifacts)
    save_nemo(os.path.join(out, "tp2.nemo"),
              model_config(gpt_config(), gpt_tokenizer, tensor_model_parallel_size=2), gpt_nemo,
              gpt_artifacts, rank_directories=["mp_rank_00", "mp_rank_01"])

    def hostile(path, member):
        with tarfile.open(path, "w:") as tar:
            data = yaml.safe_dump(model_config(gpt_config(), gpt_tokenizer)).encode()
            info = tarfile.TarInfo("./model_config.yaml")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
            tar.addfile(member, io.BytesIO(b"x" * member.size))
    escaped = tarfile.TarInfo("../escaped")
    escaped.size = 1
    hostile(os.path.join(out, "dotdot.nemo"), escaped)
    link = tarfile.TarInfo("./model_weights.ckpt")
    link.type = tarfile.SYMTYPE
    link.linkname = "/etc/passwd"
    hostile(os.path.join(out, "symlink.nemo"), link)


if __name__ == "__main__":
    main()

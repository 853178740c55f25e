#!/usr/bin/env bash
# Megatron core's torch_dist format both ways under the PyTorch at hand: run by
# run_gpu_checks.sh on the GPU machine, whose PyTorch 2.x keeps Distributed Checkpoint under
# torch.distributed.checkpoint (CI's Debian 1.13 keeps it under torch.distributed._shard; the
# unit and e2e tests cover that one). Usage, from the repository root:
#   tests/gpu/torch_dist_with_pytorch.sh [BIN]    (BIN: pretrain_gpt's and checkpoint_util's
#                                                  directory, default build/bin; PYTHON: python3)
# 1. write_torch_dist_checkpoints.py saves Megatron's sharded state with this PyTorch's DCP
#    writer over gloo ranks; checkpoint_util reads each checkpoint whole (every chunk, the
#    2.x .metadata) and reshards it to TP=1, and pretrain_gpt continues the TP=2 x PP=2 GPT in
#    one process for two iterations.
# 2. pretrain_gpt saves --ckpt-format torch_dist; read_torch_dist_checkpoint.py reads it with this
#    PyTorch's FileSystemReader and load_state_dict, and megatron_loss_reference.py computes a
#    loss from it.
# Exit status 0 when all of it worked.
set -euo pipefail
bin=${1:-build/bin}
python=${PYTHON:-python3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$python" -c 'import torch; print("PyTorch", torch.__version__)'
"$python" tests/backend/ckpt/write_torch_dist_checkpoints.py "$work"
for name in gpt_dist llama_dist gpt_dist_weights; do
  "$bin/checkpoint_util" --load "$work/$name" --save "$work/$name.tp1" \
    --target-tensor-parallel-size 1 --target-pipeline-parallel-size 1
done
model=(--num-layers 4 --hidden-size 16 --num-attention-heads 4 --ffn-hidden-size 32
       --seq-length 8 --max-position-embeddings 8 --tokenizer-type NullTokenizer --vocab-size 40
       --make-vocab-size-divisible-by 32 --hidden-dropout 0 --attention-dropout 0 --mock-data
       --micro-batch-size 2 --global-batch-size 8 --lr 3e-4 --min-lr 3e-5 --lr-decay-style cosine
       --lr-warmup-iters 5 --weight-decay 0.1 --adam-beta2 0.95 --eval-iters 0 --log-interval 1
       --device cpu)
"$bin/pretrain_gpt" "${model[@]}" --train-iters 100 --exit-interval 22 --load "$work/gpt_dist" \
  --no-load-rng \
  | tee "$work/continued.log" | grep -E "loaded checkpoint|iteration +2[12]/"
"$bin/pretrain_gpt" "${model[@]}" --train-iters 8 --exit-interval 2 --save "$work/ours" --ckpt-format torch_dist \
  >"$work/ours.log"
"$python" tests/backend/ckpt/read_torch_dist_checkpoint.py "$work/ours/iter_0000002" \
  >"$work/read.json"
"$python" -c 'import json, sys; d = json.load(open(sys.argv[1])); print("PyTorch read", len(d["tensors"]), "tensors of our torch_dist save")' "$work/read.json"
"$python" -c 'import json; print(json.dumps({"tokens": [[1, 2, 3, 4, 5, 6, 7, 8]], "labels": [[2, 3, 4, 5, 6, 7, 8, 9]]}))' \
  >"$work/batch.json"
"$python" tests/backend/ckpt/megatron_loss_reference.py "$work/ours/iter_0000002" "$work/batch.json"
echo "torch_dist with $("$python" -c 'import torch; print(torch.__version__)'): passed"

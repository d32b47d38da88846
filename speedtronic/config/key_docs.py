"""What each config key means and the rules a range or a choice cannot say: the tables
``docs/config.md`` is generated from (``scripts/generate_references.py``; a test wants every
key). Plain data, no imports.
"""

from __future__ import annotations

# ---- what each key means: docs/config.md is generated from these (a test wants every key) ----

DOCS: dict[str, str] = {
    "run.name": "the run's name, and its directory under runs/",
    "run.seed": "seeds the model's initialisation and, unless data.seed is set, the data order",
    "run.device": "where to train; auto: CUDA if visible, else MPS, else CPU",
    "run.threads": "CPU threads torch computes with (intra-op); null or 0: torch's default, one "
    "per core. On cores other processes keep busy, 1 is often several times faster (as "
    "--threads; docs/troubleshooting.md)",
    "run.max_steps": "optimizer steps in total: a global target that a resumed run continues to",
    "run.time_budget_s": "seconds of training (from the first step's end; start-up apart), "
    "then the run ends as completed; the schedule decays over them; with max_steps: whichever "
    "comes first (as --time-budget)",
    "run.output_dir": "logs and checkpoints; null: runs/<name>",
    "run.group_timeout_s": "seconds a DDP rank (torchrun) waits for the others in one "
    "collective before the group gives up: a dead rank cannot hang the rest longer",
    "run.find_unused_parameters": "DDP: allow parameters that get no gradient in a step "
    "(a model with branches it may skip); costs a graph walk per step",
    "model.name": "a registered model, or an import path 'package.module:factory'",
    "model.imports": "modules imported first, so the @register_model in them runs",
    "model.lora": "LoRA adapters on the model's linear layers, trained alone on the frozen "
    "--init-from model: {r (rank, 8), alpha (scale alpha/r; 16), dropout (0.0), "
    "target_modules (q_proj k_proj v_proj o_proj gate_proj up_proj down_proj; Llama's names "
    "or the model's own, attn.wq ...)}; checkpoints hold the adapters",
    "data.source": "where samples come from; auto: text or tokens if that path is set, else "
    "synthetic",
    "data.text_path": "a UTF-8 text file, streamed and never loaded whole (a .jsonl or "
    ".parquet corpus: speedtronic data tokenize it first, then token_path)",
    "data.token_path": "a flat uint16/uint32 token file (nanoGPT layout), or a folder "
    "speedtronic data tokenize wrote (its train shards, its manifest's tokenizer); read with "
    "pread",
    "data.token_dtype": "the token file's dtype; auto: uint16 if model.vocab_size <= 65536 "
    "(a folder's manifest says)",
    "data.tokenizer": "byte (vocab 256), the path of a Hugging Face tokenizers JSON file, or "
    "hf://OWNER/MODEL/tokenizer.json",
    "data.micro_batch_size": "samples per forward/backward pass",
    "data.target_batch_size": "samples per optimizer step (gradient accumulation); "
    "null: micro_batch_size",
    "data.seq_len": "tokens per sample; null: model.seq_len, else 128",
    "data.num_workers": "DataLoader worker processes, each reading its own blocks; more than "
    "the CPU cores: cut to the cores (a streamed tokenized text keeps its count)",
    "data.prefetch_factor": "batches each worker loads ahead (with num_workers > 0)",
    "data.pin_memory": "page-locked batches for faster copies; auto: on CUDA only",
    "data.shuffle": "read blocks in a seeded random order (false: in file order)",
    "data.seed": "seed of the data order; null: run.seed, or per node for DumbDiLoCo",
    "data.shuffle_buffer": "blocks mixed by the shuffle buffer of a streamed, non-byte tokenizer",
    "data.eval_path": "a held-out file of the same kind as the training source; the "
    "token_path folder itself: its held-out part (data tokenize --val-fraction)",
    "data.eval_fraction": "hold out this share of the end of the training file instead",
    "data.eval_every": "optimizer steps between evaluations (and one at the end); 0: at the end "
    "only",
    "data.eval_batches": "batches per evaluation (the same ones every time)",
    "optimizer.name": "adamw: AdamW, weight decay on matrices only; muon: Muon on the hidden "
    "matrices, that AdamW on the rest (see Muon below)",
    "optimizer.lr": "peak learning rate",
    "optimizer.betas": "AdamW's two moment decay rates",
    "optimizer.eps": "AdamW's epsilon",
    "optimizer.weight_decay": "decoupled weight decay, applied to matrices only",
    "optimizer.fused": "the fused AdamW kernel; auto: where available, else foreach",
    "optimizer.grad_clip": "clip the global gradient norm to this; null or 0: no clipping",
    "optimizer.muon_lr": "Muon's peak lr (the schedule scales it as it scales lr); null: "
    "optimizer.lr with match_rms_adamw, else 0.02",
    "optimizer.muon_lr_adjust": "original: lr x sqrt(max(1, rows/cols)), the update's spectral "
    "norm ~ lr (Jordan); match_rms_adamw: lr x 0.2 sqrt(max(rows, cols)), AdamW's update RMS, "
    "so AdamW's lr and weight decay carry over (Moonlight)",
    "optimizer.muon_momentum": "Muon's momentum (an exponential average of the gradients)",
    "optimizer.muon_nesterov": "Nesterov momentum: orthogonalise the gradient's lerp towards "
    "the average, not the average itself",
    "optimizer.muon_ns_steps": "Newton-Schulz iterations per step",
    "optimizer.muon_weight_decay": "Muon's decoupled weight decay (x muon_lr per step); null: "
    "AdamW's shrink per step, lr x weight_decay / muon_lr",
    "optimizer.muon_momentum_warmup_steps": "ramp Muon's momentum from 0.85 up over this many "
    "steps (the speedrun's warm-up); 0: off",
    "optimizer.muon_precision": "the Newton-Schulz iteration's dtype; auto: bf16 where it is "
    "native (CUDA, a CPU the probe finds bf16-capable), else fp32",
    "optimizer.muon_exclude": "fnmatch patterns of parameter names (blocks.0.*) kept on AdamW",
    "scheduler.name": "after the warmup: cosine decay to min_lr_ratio * lr, constant, or wsd "
    "(constant, then a linear decay to min_lr_ratio * lr over the last decay_fraction)",
    "scheduler.warmup_steps": "optimizer steps of linear warmup",
    "scheduler.min_lr_ratio": "the cosine's final learning rate, as a share of lr",
    "scheduler.total_steps": "the schedule's length in steps; null: run.max_steps when the run "
    "starts (--resume keeps it: see the note below)",
    "scheduler.decay_fraction": "wsd only: the share of the schedule's steps that decays",
    "scheduler.rewarm_steps": "--resume only (--rewarm N): from the resumed step, warm up "
    "linearly over N steps to lr, then decay per name to the run's new end, keeping the "
    "optimizer's moments, data position and random streams; 0: off",
    "scheduler.rewarm_from": "the step a re-warm started at; set by --resume and recorded in "
    "meta.json so a later resume follows the same curve; leave null",
    "scheduler.continue_factor": "the LR factor (of lr) where --resume gave the run a new end "
    "(another time budget, or steps instead of one); the decay goes on from it to min_lr_ratio "
    "at the new end; set by --resume and recorded in meta.json; leave null",
    "scheduler.continue_progress": "the new end's progress in [0, 1] where continue_factor was "
    "recorded; set by --resume; leave null",
    "precision.mode": "auto: bf16 on CUDA that has it, fp16 on other CUDA, fp32 on CPU/MPS",
    "precision.flush_denormal": "on CPU, train with subnormal floats flushed to zero on every "
    "thread torch computes on (each thread's own setting restored after the loop); false keeps "
    "IEEE subnormals, at several microseconds each",
    "compile": "torch.compile the model (falls back to eager with a warning if it fails)",
    "gradient_checkpointing": "call the model's set_gradient_checkpointing(True)",
    "checkpoint.directory": "where checkpoints go; null: <output_dir>/checkpoints",
    "checkpoint.interval": "optimizer steps between saves; 0: only at the end",
    "checkpoint.keep_last": "newest complete checkpoints kept; null: keep all",
    "checkpoint.resume": "continue from the newest good checkpoint (as --resume); config changes: "
    "see the note below",
    "checkpoint.overwrite": "delete the checkpoints of the run already in the directory and start "
    "fresh (as --overwrite); false: such a directory is refused",
    "checkpoint.init_from": "start this fresh run from the weights of a run (its output_dir), its "
    "checkpoints/ dir or a step_* dir, or of a transformers model (its directory, an export's "
    "included, or hf://OWNER/NAME[@REV]) (as --init-from); optimizer, schedule, step count and "
    "RNG start fresh; a config naming no model takes the source's model and tokenizer",
    "checkpoint.init_overrides": "model keys allowed to differ from init_from's source (as "
    "--init-override KEY); any other key that changes what the weights compute is refused",
    "checkpoint.allow_tokenizer_mismatch": "train on data tokenized with another tokenizer than "
    "init_from's (as --allow-tokenizer-mismatch); the checkpoints record the data's; false: "
    "refused before the first step",
    "checkpoint.keep_budget": "--resume of a run with a time budget, by a config that sets none: "
    "keep the checkpoint's run.time_budget_s and run.max_steps; false (as --max-steps on a "
    "resume): end the run by run.max_steps instead",
    "logging.level": "least level of the plain lines; warning: warnings only (JSONL gets all)",
    "logging.file": "also write the plain log lines here (relative: in output_dir)",
    "logging.json_file": "also write every event as JSON lines here (relative: in output_dir)",
    "logging.every_steps": "optimizer steps between log lines",
    "logging.hooks": "metric hooks: tensorboard, wandb, or import paths of your own",
    "distributed.enabled": "train with DumbDiLoCo through a shared repo (docs/diloco.md)",
    "distributed.mode": "the algorithm; only dumb_diloco",
    "distributed.role": "worker trains and uploads deltas; master also averages and publishes",
    "distributed.node_id": "this node's folder in the repo; null: $HF_USERNAME, $USER or local",
    "distributed.repo_id": "a Hub repo id owner/name, a bucket s3://bucket/prefix "
    "(docs/storage.md), or a shared directory path or file:// URL",
    "distributed.endpoint_url": "s3:// repos only: the store's URL (MinIO, R2, the Hugging Face "
    "gateway https://s3.hf.co/<namespace>); null: $AWS_ENDPOINT_URL, else AWS S3",
    "distributed.path": "alias of repo_id for a shared directory",
    "distributed.token": "Hub token; null: $HF_TOKEN or the saved login (never logged)",
    "distributed.inner_steps": "optimizer steps between syncs (H)",
    "distributed.poll_interval": "seconds between checks of the repo",
    "distributed.reset_inner_optimizer": "true: clear AdamW moments at every install "
    "(upstream DiLoCo; measured worse, docs/diloco.md)",
    "distributed.reapply_own_delta": "install the global minus this node's deltas it lacks",
    "distributed.install": "eager: install a newer global as soon as it is downloaded, "
    "keeping the progress since the last boundary; boundary: only between inner loops",
    "distributed.train_locally": "false: a master that only coordinates, until the run ends",
    "distributed.outer_steps": "a coordinating-only master ends the run at this outer step (once "
    "every node's last delta is in), or earlier when every node has ended",
    "distributed.state_dir": "the master's state; null: <output_dir>/diloco_master",
    "distributed.outer_lr": "the master's outer learning rate on the averaged delta",
    "distributed.outer_momentum": "Nesterov momentum of the outer step; 0: plain averaging",
    "distributed.min_deltas": "deltas a round waits for (quorum)",
    "distributed.max_wait_s": "or run a partial round this long after the first delta",
    "distributed.max_staleness": "deltas more outer steps behind than this are dropped",
    "distributed.staleness_discount": "a delta's weight is multiplied by this per step behind",
    "distributed.outer_policy": "fleet: each round as its share of the fleet's work; naive: "
    "each in full",
    "distributed.delta_dtype": "encoding of uploaded deltas: fp32, bf16 (half), int8 (a quarter), "
    "int4 (0.13) or int2 (0.07), the last two with a scale per 128 values",
    "distributed.error_feedback": "add what quantization dropped from a delta to the node's next "
    "one (bf16 / int8 / int4 / int2)",
    "distributed.global_dtype": "the master's publishes: fp32 (full weights every round), or "
    "int8 / int4 (0.26 / 0.13 of fp32's bytes): an update on a keyframe, full weights renewed "
    "every keyframe_every outer steps; deltas: a round record, every node applies the round's "
    "deltas itself (exact; outer_momentum 0)",
    "distributed.keyframe_every": "global_dtype int8 / int4 / deltas: outer steps between "
    "keyframes "
    "(full weights a node downloads once)",
    "distributed.upload_timeout_s": "how long a node waits for its last upload at the end",
    "distributed.drain_timeout_s": "the end of a run: how long a silent node is waited for (and "
    "a worker waits for a global holding its last delta); null: from the fleet's pace",
    "distributed.stop_grace_s": "on SIGTERM/Ctrl-C: after the checkpoint, how long a node still "
    "sends and waits before it exits (a second signal: at once)",
    "distributed.in_flight_disk_bytes": "disk for sent deltas no global includes yet (past 3 in "
    "memory); past it, uploads wait in the outbox",
    "distributed.sync_wait_s": "> 0: wait up to this long for the global with this node's delta",
    "distributed.min_publish_interval_s": "the master's least pause between publishes (Hub and "
    "buckets; every publish is full weights each worker downloads)",
    "distributed.squash_every": "Hub only: squash the repo's history every N publishes; 0: never",
    "distributed.collaborators": "Hub only: users the master tries to grant write access at start",
    "distributed.cache_dir": "Hub only: cache of downloaded globals; null: the user cache dir",
    "eval.sets": "named held-out sets, each NAME=PATH: a UTF-8 text file, a .jsonl/.parquet "
    "corpus (its text column), or a data tokenize folder (its val part); scored for loss and "
    "bits per byte (docs/evaluation.md)",
    "eval.every": "optimizer steps between scorings of eval.sets (and one at the end); "
    "0: data.eval_every",
    "eval.max_tokens": "tokens scored per set per evaluation (its first ones, the same each time)",
    "eval.batch_size": "windows per forward pass; null: data.micro_batch_size",
}

# Rules a range or a choice cannot say, checked by the sections' ``check`` methods or build
CHECKED: dict[str, str] = {
    "run.name": "a directory name: 1-255 bytes, no / or \\ or control characters, not . or ..",
    "run.device": "auto, cpu, cuda, cuda:N or mps",
    "run.threads": "at most this machine's cores (os.cpu_count())",
    "data.text_path": "not with token_path; required when source is text; not with source "
    "synthetic or tokens",
    "data.token_path": "not with text_path; required when source is tokens; not with source "
    "synthetic or text",
    "data.tokenizer": "a path only with a text or token source, not with source synthetic",
    "data.target_batch_size": "a multiple of micro_batch_size",
    "data.seq_len": "<= model.seq_len for reference_transformer",
    "data.eval_path": "not with eval_fraction; needs a text or token source",
    "data.eval_every": "needs eval_path or eval_fraction > 0",
    "optimizer.betas": "each in [0, 1)",
    **{
        f"optimizer.muon_{key}": "only with name: muon"
        for key in (
            "lr",
            "lr_adjust",
            "momentum",
            "nesterov",
            "ns_steps",
            "weight_decay",
            "momentum_warmup_steps",
            "precision",
        )
    },
    "optimizer.muon_exclude": "only with name: muon; each pattern must match a parameter",
    "scheduler.decay_fraction": "only with name: wsd",
    "scheduler.rewarm_steps": "needs checkpoint.resume, not with run.time_budget_s; fewer "
    "than the steps left after the resumed step (run.max_steps, or total_steps, minus it)",
    "scheduler.rewarm_from": "only with rewarm_steps > 0",
    "logging.hooks": "tensorboard, wandb or 'package.module:attribute'",
    "model.name": "an import path must not name a standard-library module (os:system, ...)",
    "model.lora": "needs checkpoint.init_from, not with optimizer.name muon; r in [1, 2**16], "
    "alpha > 0, dropout in [0, 1), target_modules each a layer of the model, unknown keys "
    "refused",
    "checkpoint.overwrite": "not with resume",
    "checkpoint.init_from": "a directory or hf://OWNER/NAME[@REV]; unused when --resume finds a "
    "checkpoint; not inside the directory --overwrite deletes; the weights must fit the model, "
    "whose keys must equal the source's unless listed in init_overrides",
    "checkpoint.init_overrides": "each one of vocab_size, n_layer, d_model, n_head, n_kv_head, "
    "mlp_hidden, rope_theta, norm_eps, tie_embeddings, qk_norm",
    "distributed.node_id": "1-64 letters, digits, _ . -, starting with a letter or digit",
    "distributed.repo_id": "required when enabled; not with a different path; s3://: a bucket "
    "name of 3-63 letters, digits, . - _ and a prefix of safe folder names",
    "distributed.endpoint_url": "http(s)://host[:port][/path], no credentials; s3:// repos only",
    "distributed.train_locally": "false only for a master",
    "distributed.outer_steps": "required when train_locally is false",
    "distributed.collaborators": "Hugging Face user names",
    "eval.sets": "unique names of 1-64 letters, digits, _ . -; needs every or data.eval_every",
}

# reference_transformer's own keys (model.<key>): (rule, meaning)
REFERENCE_DOCS: dict[str, tuple[str, str]] = {
    "vocab_size": ("> 0", "vocabulary size; must cover the tokenizer's ids"),
    "seq_len": ("in [1, 2**20]", "context length (alias max_seq_len); RoPE tables are this long"),
    "n_layer": ("> 0", "transformer blocks"),
    "n_head": ("> 0, divides d_model (unless head_dim is set)", "attention heads"),
    "n_kv_head": ("> 0, divides n_head", "key/value heads (grouped-query); null: n_head"),
    "d_model": ("> 0, d_model / n_head even", "width of the residual stream"),
    "mlp_hidden": ("> 0", "SwiGLU hidden width; null: 8/3 d_model, rounded up to 64"),
    "rope_theta": ("> 0", "RoPE base frequency"),
    "norm_eps": ("> 0", "RMSNorm epsilon"),
    "init_std": ("> 0", "standard deviation of the initial weights"),
    "tie_embeddings": ("-", "share the embedding matrix with the output head"),
    "qk_norm": (
        "-",
        "RMSNorm of each head's queries and keys before RoPE (not Llama's "
        "architecture: measured, docs/benchmarks.md, Time to quality)",
    ),
    "zero_init_projections": ("-", "start the attention and MLP output projections at zero"),
    "head_dim": ("> 0, even", "width of one attention head; null: d_model / n_head"),
    "qkv_bias": ("-", "a bias on the query, key and value projections (Qwen2)"),
    "rope_scaling": (
        "4 numbers > 0, low < high",
        "Llama-3 RoPE scaling: [factor, low_freq_factor, high_freq_factor, original context]; "
        "null: none",
    ),
}

# Prose after a section's table in docs/config.md: section -> lines of Markdown
SECTION_NOTES: dict[str, list[str]] = {
    "optimizer": [
        "",
        "### Muon (`optimizer.name: muon`)",
        "",
        "Muon (Jordan et al. 2024; torch.optim.Muon's update, `optim/muon.py`) takes the",
        "model's *hidden* weight matrices: momentum, then a Newton-Schulz iteration that",
        "orthogonalises the update. Everything else (the embedding, the output head, norm",
        "gains, biases, anything not 2-D) stays on the AdamW above, with its `lr`, `betas`,",
        "`eps`, `weight_decay` and `fused`. One schedule scales both lrs.",
        "",
        "- **Which matrices** (`optim/param_split.py`), by module, not by shape: a model",
        "  with a `hidden_matrices()` method (an iterable of its own 2-D parameters) says so",
        "  itself; the reference decoder's are its blocks' seven projections, so its embedding,",
        "  which is also its tied head, is on AdamW. Any other model: every `nn.Linear` weight",
        "  except one an `nn.Embedding` also holds and a head named `lm_head`, `head`, `output`,",
        "  `classifier`, `fc_out` or `logits`. Then `muon_exclude` moves more to AdamW by name",
        "  (`fnmatch`: `blocks.0.*`). `speedtronic validate` prints the split; the live",
        "  table's title and the `run_start` event's `optimizer` name it",
        "  (`muon (14 matrices, bf16) + adamw (fused)`).",
        "- **lr conventions**: `original` (Jordan's) scales each matrix's step by",
        "  sqrt(max(1, rows/cols)), so `muon_lr` is about the update's spectral norm (0.02 is",
        "  the usual value); `match_rms_adamw` (Moonlight) by 0.2 sqrt(max(rows, cols)), so the",
        "  update's RMS is AdamW's and `lr` and `weight_decay` carry over unchanged.",
        "- **Weight decay**: decoupled, `muon_lr x muon_weight_decay` per step (torch's rule);",
        "  unset, the same shrink per step as AdamW's (`lr x weight_decay`).",
        "- **Speed**: same-shape matrices are orthogonalised together (batched matmuls), in",
        "  bf16 where it is native (CUDA, a CPU with AVX512-BF16/AMX, found by the precision",
        "  probe) and fp32 where bf16 would be emulated. Its cost is per matrix, not per token:",
        "  `speedtronic bench` reports the optimizer's share of a step.",
        "- **Measured** ([benchmarks.md](benchmarks.md#time-to-quality-muon-against-tuned-adamw"
        "-benchmarkstime_to_qualitypy-issue-30)): to the final eval loss of an AdamW whose lr was",
        "  tuned, Muon took 0.566x / 0.525x the training time on the 0.43M reference decoder",
        "  (seeds 0 / 1; A/A noise 0.998) and about 0.71x-0.72x the CPU time on a 4.5M one",
        "  (AdamW tuned there too; 0.667x / 0.714x the steps; its wall-clock ratios there are",
        "  noise-bound: A/A 1.193); as DiLoCo's inner optimizer (4 workers, f = 0.25) the global",
        "  ended 4.9% / 10.3% below today's defaults.",
        "  So the embedded smoke run (`configs/smoke.yaml`, this very shape) and",
        "  `configs/diloco.yaml` use Muon; the key's default stays `adamw`, for a model of your",
        "  own (whose split and lr pair nothing here measured) and for `configs/gpt2_small.yaml`",
        "  (124M: not measured on this machine; `benchmarks/gpu_check.sh` races both on a GPU).",
    ],
    # the rules that concern several keys at once
    "scheduler": [
        "",
        "**The schedule across `--resume`.** The schedule's horizon (`total_steps`, or",
        "`run.max_steps` when the run started) is frozen for the run: resuming with a larger",
        "`run.max_steps` follows the same curve to the original horizon, then stays at the",
        "schedule's final LR (`min_lr_ratio * lr` for cosine, `lr` for constant); the LR never",
        "jumps back up. The resumed run's meta.json records that horizon as",
        "`scheduler.total_steps`. A changed `name`, `warmup_steps`, `min_lr_ratio` or",
        "`total_steps` is refused, unless the resume starts a new schedule with",
        "`--rewarm N` (`rewarm_steps`): the LR then warms up linearly from the resumed step over",
        "N steps to `lr` (a new value is the new peak) and decays per `name` to the new",
        "`run.max_steps` (or `total_steps`), from the saved optimizer state. `--init-from RUN`",
        "starts a new schedule with a fresh optimizer.",
    ],
    "checkpoint": [
        "",
        "**A config that differs on `--resume`.** Every key that differs from the config the",
        "checkpoint recorded is named in one line. The optimizer's settings (`lr`, `betas`,",
        "`eps`, `weight_decay`, `grad_clip`, `fused`), `run.max_steps`, logging, the evaluation",
        "cadence and files, device, precision, compile and the checkpoint cadence are applied",
        "from the next step. What the saved state depends on is refused with the way to do it",
        "(exit 2, nothing written): every `model.*` key, `run.seed`, `optimizer.name`, the data",
        "source, files, tokenizer, order and batch layout (`data.source`, `text_path`,",
        "`token_path`, `token_dtype`, `tokenizer`, `eval_fraction`, `shuffle`, `seed`,",
        "`shuffle_buffer`, `micro_batch_size`, `target_batch_size`, `seq_len`; `num_workers` of a",
        "streamed tokenized text), the schedule (above) and a DumbDiLoCo node's identity. See",
        "[checkpoints.md](checkpoints.md#resume-with-a-changed-config).",
    ],
}

"""``speedtronic generate`` and ``speedtronic export``: a trained run's model, used and taken out.

``generate`` samples text from RUN's checkpoint with a KV cache, streaming it to stdout as it
comes (``--format json``: one object per sample instead) and tokens/s to stderr. ``export``
writes a directory transformers loads, checks it with transformers (``--verify``) and uploads it
to a Hub model repo (``--push``). The work is ``speedtronic.modelout``'s and
``speedtronic.hub.models``'; torch, the engine and the Hub client load in the command bodies,
so ``--help`` and completion import only this module's option declarations.
"""

from __future__ import annotations

import secrets
import sys
from pathlib import Path
from typing import Any

import typer

from speedtronic.cli.errors import handle_errors
from speedtronic.cli.jsonout import json_text
from speedtronic.cli.options import JSON_SCHEMA_VERSION, OutputFormat, format_option, size_text
from speedtronic.errors import ConfigError, TransportError

RunArg = typer.Argument(
    ...,
    help="A run's output directory (its newest usable checkpoint), its checkpoints directory, "
    "or one checkpoint directory (model.safetensors + meta.json, e.g. a DumbDiLoCo final global).",
)
TokenizerOpt = typer.Option(
    None,
    "--tokenizer",
    help="'byte' or a tokenizers JSON file: the tokenizer the data was tokenized with, for a "
    "checkpoint that does not record one. Default: the checkpoint's.",
)


def generate(
    run: Path = RunArg,
    prompt: str | None = typer.Option(
        None, "--prompt", "-p", help="The text to continue. Default: a newline."
    ),
    prompt_file: Path | None = typer.Option(
        None, "--prompt-file", help="Read the text to continue from this UTF-8 file."
    ),
    max_new_tokens: int = typer.Option(
        200, "--max-new-tokens", min=1, help="How many tokens to generate per sample."
    ),
    temperature: float = typer.Option(
        0.8, "--temperature", min=0.0, help="Sampling temperature; 0 picks the likeliest token."
    ),
    top_k: int | None = typer.Option(
        None, "--top-k", min=1, help="Sample only among the K likeliest tokens."
    ),
    top_p: float | None = typer.Option(
        None,
        "--top-p",
        help="Sample only among the likeliest tokens whose probability adds up to P (nucleus).",
    ),
    seed: int | None = typer.Option(
        None,
        "--seed",
        min=0,
        help="Seed of the sampling, for the same text again. Default: random.",
    ),
    num_samples: int = typer.Option(1, "--num-samples", min=1, help="How many samples to draw."),
    device: str = typer.Option(
        "auto", "--device", help="Device to generate on: auto, cpu, cuda, cuda:N or mps."
    ),
    threads: int | None = typer.Option(
        None,
        "--threads",
        min=1,
        help="CPU threads torch computes with. Default: torch's (one per core); on cores other "
        "work keeps busy, 1 is often several times faster at batch 1 (docs/benchmarks.md).",
    ),
    tokenizer: str | None = TokenizerOpt,
    stop: list[str] | None = typer.Option(
        None,
        "--stop",
        metavar="TEXT",
        help="Also stop a sample once its text contains TEXT (left out of the completion); "
        "repeatable.",
    ),
    no_stop: bool = typer.Option(
        False,
        "--no-stop",
        help="Do not stop at the run's end-of-document tokens (its tokenizer's end-of-text, "
        "the data's separator); by default a sample ends there.",
    ),
    chat: bool = typer.Option(
        False,
        "--chat",
        help="Take the prompt as a user's message in the run's chat template (the one its "
        "model was imported or fine-tuned with): the model answers as the assistant, and a "
        "sample ends at the end of its turn.",
    ),
    output_format: OutputFormat = format_option("the text as it is generated"),
) -> None:
    """Sample text from a trained run's model (KV cache; the run's tokenizer and precision).

    Text streams to stdout as it is generated, the prompt first; tokens/s goes to stderr. A
    sample ends at the run's end-of-document token, a --stop text or --max-new-tokens.
    """
    text = _prompt_text(prompt, prompt_file)
    check_generate_options(threads, top_p, seed, device)
    from speedtronic.modelout.generate import Sampling

    sampling = Sampling(max_new_tokens, temperature, top_k, top_p)
    from speedtronic.train.threads import use_threads

    use_threads(threads)  # as train's --threads (run.threads)
    if any(not t for t in stop or ()):
        raise ConfigError("--stop: an empty text would stop at once; give the text to stop at")
    stops = (tuple(stop or ()), not no_stop, chat)
    _generate(run, text, sampling, seed, num_samples, device, tokenizer, output_format, stops)


SEED_MAX = 2**63 - 1  # torch seeds are 64-bit; the signed range is what every tool accepts


def check_generate_options(
    threads: int | None, top_p: float | None, seed: int | None, device: str
) -> None:
    """Values generate would only crash on later (a segfault, a library's RuntimeError): one
    line naming the option, the value and the rule (exit 2), before a model is loaded."""
    import os

    from speedtronic.config.sections import DEVICE_RE

    cores = os.cpu_count() or 1
    if threads is not None and not 1 <= threads <= cores:
        raise ConfigError(f"--threads: must be in 1..{cores}, this machine's cores (got {threads})")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise ConfigError(f"--top-p: must be in (0, 1] (got {top_p})")
    if seed is not None and not 0 <= seed <= SEED_MAX:
        raise ConfigError(f"--seed: must be in 0..{SEED_MAX} (2**63-1) (got {seed})")
    if not DEVICE_RE.fullmatch(device):
        raise ConfigError(f"--device: must be auto, cpu, cuda, cuda:N or mps (got {device!r})")


def _prompt_text(prompt: str | None, prompt_file: Path | None) -> str:
    if prompt is not None and prompt_file is not None:
        raise ConfigError("--prompt and --prompt-file: give one of them, not both")
    if prompt_file is None:
        return "\n" if prompt is None else prompt
    try:
        return prompt_file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or exc
        raise ConfigError(
            f"--prompt-file: cannot read {prompt_file} as UTF-8 text: {reason}"
        ) from None


def _generate(run_path, text, sampling, seed, num_samples, device, tokenizer, output_format, stops):
    import torch

    from speedtronic.modelout.chat_prompt import chat_prompt
    from speedtronic.modelout.generate import Decoder, check_prompt, generate, vocab_size
    from speedtronic.modelout.source import open_run
    from speedtronic.modelout.stops import Completion, Stopper, stop_tokens

    run = open_run(run_path, tokenizer, log=_note)
    tok = run.require_tokenizer()
    precision = _precision(run, device)
    model = run.model.to(precision.device)
    window = getattr(getattr(model, "config", None), "seq_len", None) or run.context_len
    texts, at_tokens, chat = stops
    end_ids = stop_tokens(tok, run.config) if at_tokens else {}
    if chat:  # the user's text in the run's template; the turn's end is a stop
        text, end = chat_prompt(tok, text)
        ids = tok(end) if end else []
        if len(ids) == 1:
            end_ids[ids[0]] = end
        elif end:
            texts = (*texts, end)
    prompt_ids = tok(text)
    check_prompt(prompt_ids, vocab_size(model))  # before anything is printed
    seed = secrets.randbelow(2**31) if seed is None else seed
    generator = torch.Generator().manual_seed(seed)
    how = "KV cache" if callable(getattr(model, "forward_cached", None)) else "no KV cache"
    for index in range(num_samples):
        decoder = Decoder(model, window, precision)
        as_text = output_format is OutputFormat.text
        if as_text:
            print("\n---\n" if index else "", text, sep="", end="", flush=True)
        completion = Completion(tok.decode_stream(prompt_ids), texts, _write if as_text else None)
        stopper = Stopper(end_ids, completion)
        sample = generate(decoder, prompt_ids, sampling, generator, None, stopper)
        completed = completion.finish()  # what was held back in case a stop text began there
        if as_text:
            print(flush=True)
        where = f"{precision.device.type}, {precision.mode}, {how}"
        _note(
            f"sample {index + 1} of {num_samples}: {len(sample.ids)} tokens in "
            f"{sample.seconds:.2f} s, {sample.tokens_per_s:.1f} tokens/s "
            f"(step {run.step}, {where}, seed {seed})"
            + ("" if sample.stop_reason == "max_tokens" else f"; stopped: {sample.stop_reason}")
        )
        if sample.slid:
            _note(
                f"the context window ({window} tokens) filled up {sample.slid} time(s); each "
                f"time generation went on from its newest {window // 2 or 1} tokens"
            )
        if output_format is OutputFormat.json:
            record = _sample_json(run, text, completed, sample, index, seed)
            print(json_text(record, indent=None), flush=True)


def _precision(run: Any, device: str) -> Any:
    from speedtronic.train.precision import emulation_warning, resolve_device, resolve_precision

    try:
        resolved = resolve_device(device)
    except ConfigError as exc:
        raise ConfigError(str(exc).replace("run.device", "--device", 1)) from None
    precision = resolve_precision(run.precision_mode, resolved, _note)
    emulated = emulation_warning(resolved, precision.mode)
    if emulated:
        _note(emulated)
    return precision


def _write(piece: str) -> None:
    sys.stdout.write(piece)
    sys.stdout.flush()


def _sample_json(run, text: str, completion: str, sample, index: int, seed: int) -> dict:
    return {
        "schema_version": JSON_SCHEMA_VERSION,
        "sample": index,
        "prompt": text,
        "completion": completion,
        "tokens": sample.ids,
        "num_tokens": len(sample.ids),
        "prompt_tokens": len(sample.prompt_ids),
        "seconds": sample.seconds,
        "tokens_per_s": sample.tokens_per_s,
        "seed": seed,
        "checkpoint": str(run.checkpoint),
        "step": run.step,
        "stop": sample.stop_reason,
    }


def _note(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def export(
    run: Path = RunArg,
    out: Path = typer.Argument(
        ..., help="The directory to write; new or empty (or an earlier export, replaced)."
    ),
    dtype: str = typer.Option(
        "fp32", "--dtype", help="Weights' dtype in the export: fp32 or bf16."
    ),
    push: str | None = typer.Option(
        None,
        "--push",
        metavar="OWNER/NAME",
        help="Also upload the export to this Hub model repo in one commit (created if missing; "
        "token from HF_TOKEN or `hf auth login`).",
    ),
    private: bool = typer.Option(
        True,
        "--private/--public",
        help="Visibility of a repo that --push creates (an existing repo keeps its own).",
    ),
    verify: bool = typer.Option(
        False,
        "--verify",
        help="Load the export with transformers and check its logits, greedy tokens and "
        "tokenizer against the run's before writing it (needs transformers).",
    ),
    adapter: bool = typer.Option(
        False,
        "--adapter",
        help="A LoRA run (model.lora): write its adapters alone in peft's layout "
        "(adapter_config.json + adapter_model.safetensors, for PeftModel.from_pretrained on "
        "the exported base) instead of the model with the adapters merged in.",
    ),
    tokenizer: str | None = TokenizerOpt,
    output_format: OutputFormat = format_option("a summary"),
) -> None:
    """Write RUN's model as a directory transformers loads (LlamaForCausalLM + tokenizer + card).

    AutoModelForCausalLM.from_pretrained(OUT) and AutoTokenizer.from_pretrained(OUT) load it;
    a LoRA run's is the base with the adapters merged in, or with --adapter the adapters alone.
    """
    from speedtronic.modelout.export import export_run

    if push is not None:
        from speedtronic.hub.models import check_model_repo_id

        check_model_repo_id(push)
    if verify:
        from speedtronic.modelout.verify import load_transformers

        load_transformers()  # refuse at once when it is missing, before any work
    from speedtronic.modelout.source import open_run

    source = open_run(run, tokenizer, log=_note)
    check = None
    if verify:
        from speedtronic.modelout import verify as checks

        def check(folder: Path) -> Any:
            if adapter:
                return checks.verify_adapter(folder, source, dtype)
            return checks.verify_export(folder, source, dtype)

    if adapter:
        from speedtronic.modelout.adapter import export_adapter

        done = export_adapter(source, out, dtype, verify=check)
    else:
        done = export_run(source, out, dtype, repo_id=push, verify=check)
    for note in done.notes:
        _note(f"note: {note}")
    pushed = _push(done.out, push, private) if push is not None else None
    if output_format is OutputFormat.json:
        print(json_text(_export_json(source, done, pushed)))
        return
    _report(source, done, pushed)


def _push(out: Path, repo_id: str, private: bool) -> Any:
    import os

    from speedtronic.hub.models import push_folder
    from speedtronic.modelout.export import export_files

    try:
        return push_folder(
            out, export_files(out), repo_id, private=private, endpoint=os.environ.get("HF_ENDPOINT")
        )
    except TransportError as exc:
        status = getattr(exc, "status", None)
        if status in (401, 403):
            message = (
                f"--push: the Hub refused the token ({status}) for {repo_id}: use a token that "
                "can write there (HF_TOKEN or `hf auth login`)"
            )
        else:
            message = f"--push: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
        raise TransportError(
            message,
            hint=f"the export in {out} is complete; run the same command again to push it",
        ) from None


def _report(source: Any, done: Any, pushed: Any) -> None:
    verb = "replaced the export in" if done.replaced else "wrote"
    files = ", ".join(f"{name} ({size_text(size)})" for name, size in done.files.items())
    print(f"{verb} {done.out} from {source.checkpoint} (step {source.step}): {files}")
    if done.verified is not None:
        v = done.verified
        print(
            f"verified with transformers {v.transformers_version}"
            f"{' and peft' if 'adapter_config.json' in done.files else ''}: max |logit "
            f"difference| {v.max_diff:.3g} over {v.positions} positions, {len(v.greedy)} greedy "
            f"tokens equal{'' if 'adapter_config.json' in done.files else ', tokenizer ids equal'}"
        )
    if pushed is not None:
        state = "private" if pushed.private else "public" if pushed.private is False else "?"
        made = "created, " if pushed.created else ""
        print(f"pushed to {pushed.url} ({made}{state}, commit {pushed.commit[:12]})")
    # after a push the repo is what others can load; the folder is only on this machine
    where = pushed.repo_id if pushed is not None else str(done.out)
    if "adapter_config.json" in done.files:
        print(f"load it: PeftModel.from_pretrained(BASE, {where!r}), BASE the exported base")
        return
    print(f"load it: AutoModelForCausalLM.from_pretrained({where!r})")


def _export_json(source: Any, done: Any, pushed: Any) -> dict:
    return {
        "schema_version": JSON_SCHEMA_VERSION,
        "out": str(done.out),
        "checkpoint": str(source.checkpoint),
        "step": source.step,
        "replaced": done.replaced,
        "files": done.files,
        "verified": verification_json(done.verified),
        "pushed": None if pushed is None else dict(pushed.__dict__),
    }


def verification_json(v: Any) -> dict | None:
    """What ``--verify`` found against transformers (export and import alike); None: not run."""
    if v is None:
        return None
    return {
        "max_diff": v.max_diff,
        "positions": v.positions,
        "greedy_tokens": v.greedy,
        "transformers": v.transformers_version,
    }


def register(app: typer.Typer) -> None:
    short = "Sample text from a trained run's model (KV cache, streamed)."
    app.command(short_help=short)(handle_errors(generate))
    short = "Write a run's model as a transformers directory; --push uploads it to the Hub."
    app.command(short_help=short)(handle_errors(export))

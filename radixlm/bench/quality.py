"""`radixlm bench quality [engine flags]`: how far an engine setting moves the model from the float32 engine.

Two engines in one process, same model: the reference (float32, default flags) and the candidate (the flags given,
e.g. `--quantization int8` or `--kv-cache-dtype bfloat16`). Reported:

- greedy agreement over the first `num_tokens` tokens of each chat prompt: the fraction of prompts whose outputs
  are identical, and the mean length of the matching prefix;
- top-1 agreement: with the reference's greedy answers teacher-forced (prompt + answer as one prompt), the fraction
  of answer tokens that are the candidate's most likely token too (llama.cpp's "same top" figure): unlike the
  matching prefix, one early difference does not count every later token as a miss;
- the mean per-token log-likelihood of a public-domain English text shipped in `radixlm/bench/data/` (scored in
  windows of `window` tokens through prompt logprobs) under both engines, their difference (candidate minus
  reference: negative is worse) and the mean absolute per-token difference.
"""

from __future__ import annotations

import gc
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from radixlm.llm import LLM
from radixlm.sampling_params import SamplingParams

TEXT_PATH = Path(__file__).parent / "data" / "public_domain.txt"
# Options that describe the model and the machine, not the setting under test: the reference keeps them.
SHARED_OPTIONS = ("model", "num_threads", "max_model_len", "seed", "kv_cache_memory", "num_kv_blocks",
                  "block_size", "max_num_seqs", "max_num_batched_tokens")
CHAT_PROMPTS = (
    "What is the capital of France?", "Explain photosynthesis in simple terms.",
    "Write a haiku about the sea.", "How do I boil an egg?", "What causes the seasons on Earth?",
    "Give me three tips for learning a new language.", "What is a prime number?",
    "Summarize the story of Cinderella.", "Why is the sky blue?", "How does a bicycle stay upright?",
    "What is the difference between weather and climate?", "Write a short poem about autumn leaves.",
    "How many legs does a spider have?", "What is the boiling point of water at sea level?",
    "Describe a cat to someone who has never seen one.", "What are the primary colors?",
    "Explain what a computer program is.", "Suggest a name for a friendly robot.",
    "What should I pack for a day at the beach?", "How do plants drink water?",
    "Tell me a fun fact about the moon.", "What is the largest ocean on Earth?",
    "Write a two-sentence story about a dragon.", "How can I save money on groceries?",
    "What is gravity?", "Why do we need sleep?", "List four fruits that are red.",
    "What does a librarian do?", "How do you make a paper airplane?", "What is the water cycle?",
    "Give me a recipe idea for a quick breakfast.", "Why do leaves change color in the fall?",
)


@dataclass(frozen=True)
class QualityReport:
    num_prompts: int
    num_tokens: int
    identical_fraction: float
    mean_matching_prefix: float
    num_text_tokens: int
    reference_mean_logprob: float
    candidate_mean_logprob: float
    mean_abs_logprob_delta: float
    top1_agreement: float = 1.0

    @property
    def mean_logprob_delta(self) -> float:
        return self.candidate_mean_logprob - self.reference_mean_logprob


def _greedy(llm: LLM, prompts: list[list[int]], num_tokens: int) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=num_tokens, ignore_eos=True)
    return [output.outputs[0].token_ids for output in llm.generate(prompts, params, use_tqdm=False)]


def _text_logprobs(llm: LLM, windows: list[list[int]]) -> list[float]:
    """The log-probability of every token of every window but its first, given the tokens before it."""
    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0)
    logprobs = []
    for window, output in zip(windows, llm.generate(windows, params, use_tqdm=False), strict=True):
        for token_id, position in zip(window[1:], (output.prompt_logprobs or [])[1:], strict=True):
            logprobs.append(position[token_id].logprob)  # type: ignore[index]
    return logprobs


def _matching_prefix(a: list[int], b: list[int]) -> int:
    for index, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return index
    return min(len(a), len(b))


def _top1_agreement(llm: LLM, prompts: list[list[int]], answers: list[list[int]]) -> float:
    """The fraction of `answers`' tokens that are `llm`'s most likely token given the prompt and the answer before
    them."""
    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0)
    forced = [prompt + answer for prompt, answer in zip(prompts, answers, strict=True)]
    agreeing = total = 0
    for prompt, sequence, output in zip(prompts, forced, llm.generate(forced, params, use_tqdm=False), strict=True):
        positions = (output.prompt_logprobs or [])[len(prompt):]
        for token_id, position in zip(sequence[len(prompt):], positions, strict=True):
            agreeing += position[token_id].rank == 1  # type: ignore[index]
            total += 1
    return agreeing / total if total else 1.0


@dataclass
class _Run:
    prompts: list[list[int]]
    outputs: list[list[int]]
    text_logprobs: list[float]
    top1_agreement: float


def _run(options: dict[str, Any], prompts_text: tuple[str, ...], text: str, num_tokens: int, window: int,
         reference_outputs: list[list[int]] | None = None) -> _Run:
    """Greedy answers and text logprobs of one engine; with `reference_outputs`, also its top-1 agreement with
    them."""
    llm = LLM(**options)
    prompts = [llm.apply_chat_template([{"role": "user", "content": p}]) for p in prompts_text]
    text_ids = llm.tokenizer.encode(text, add_special_tokens=False)
    windows = [text_ids[start:start + window] for start in range(0, len(text_ids) - 1, window)]
    top1 = _top1_agreement(llm, prompts, reference_outputs) if reference_outputs is not None else 1.0
    result = _Run(prompts, _greedy(llm, prompts, num_tokens), _text_logprobs(llm, [w for w in windows if len(w) > 1]),
                  top1)
    del llm
    gc.collect()
    return result


def bench_quality(engine_options: dict[str, Any], num_prompts: int = 32, num_tokens: int = 64, window: int = 512,
                  text_path: Path = TEXT_PATH, reference_model: str | None = None,
                  reference_kv_cache_dtype: str | None = None) -> QualityReport:
    """`reference_model`: the float32 reference's model when it is not the candidate's (the same tokenizer);
    `reference_kv_cache_dtype`: its KV cache dtype when not the model's."""
    prompts = (CHAT_PROMPTS * (num_prompts // len(CHAT_PROMPTS) + 1))[:num_prompts]
    text = text_path.read_text()
    reference_options = {k: v for k, v in engine_options.items() if k in SHARED_OPTIONS}
    if reference_model is not None:
        reference_options["model"] = reference_model
    if reference_kv_cache_dtype is not None:
        reference_options["kv_cache_dtype"] = reference_kv_cache_dtype
    reference = _run(reference_options, prompts, text, num_tokens, window)
    candidate = _run(engine_options, prompts, text, num_tokens, window, reference.outputs)
    ref_outputs, ref_logprobs = reference.outputs, reference.text_logprobs
    cand_outputs, cand_logprobs = candidate.outputs, candidate.text_logprobs
    prefixes = [_matching_prefix(r, c) for r, c in zip(ref_outputs, cand_outputs, strict=True)]
    report = QualityReport(
        num_prompts=len(prompts), num_tokens=num_tokens,
        identical_fraction=sum(r == c for r, c in zip(ref_outputs, cand_outputs, strict=True)) / len(prompts),
        mean_matching_prefix=statistics.fmean(prefixes), num_text_tokens=len(ref_logprobs),
        reference_mean_logprob=statistics.fmean(ref_logprobs), candidate_mean_logprob=statistics.fmean(cand_logprobs),
        mean_abs_logprob_delta=statistics.fmean(abs(c - r) for r, c in zip(ref_logprobs, cand_logprobs, strict=True)),
        top1_agreement=candidate.top1_agreement)
    print_report(report, engine_options, reference_options)
    return report


def print_report(report: QualityReport, options: dict[str, Any], reference_options: dict[str, Any]) -> None:
    tested = {k: v for k, v in options.items() if reference_options.get(k) != v} or "(defaults)"
    reference = f" on {reference_options['model']}" if reference_options.get("model") != options.get("model") else ""
    kv = reference_options.get("kv_cache_dtype")
    reference += f" with --kv-cache-dtype {kv}" if kv is not None else ""
    print(f"\nquality of {tested} against the float32 engine{reference}")
    print(f"| greedy: prompts identical over {report.num_tokens} tokens | mean matching prefix (tokens agreeing) "
          "| top-1 agreement (teacher-forced) | text tokens | mean logprob ref | mean logprob candidate | delta "
          "| mean abs delta per token |")
    print("|---|---|---|---|---|---|---|---|")
    agreeing = report.mean_matching_prefix / report.num_tokens
    print(f"| {report.identical_fraction:.0%} of {report.num_prompts} | {report.mean_matching_prefix:.1f} "
          f"({agreeing:.1%}) | {report.top1_agreement:.1%} "
          f"| {report.num_text_tokens} | {report.reference_mean_logprob:.4f} | {report.candidate_mean_logprob:.4f} "
          f"| {report.mean_logprob_delta:+.4f} | {report.mean_abs_logprob_delta:.4f} |")

"""SamplingParams: how to generate, with OpenAI / vLLM field names, validated once and frozen."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from types import MappingProxyType
from typing import Any

from radixlm.errors import ParamError
from radixlm.structured.grammar_spec import GrammarSpec

MAX_LOGPROBS = 20
# Caps on the sizes a client controls (every stop string is looked for after every token; every bias entry and stop
# token id is applied to every row of every step).
MAX_STOP_STRINGS = 64
MAX_STOP_STRING_CHARS = 1024
MAX_TOKEN_ID_LIST = 4096  # logit_bias entries, stop_token_ids
MAX_SEQUENCES = 4096  # n, best_of: the engine caps them lower (--max-sequences-per-request, --max-num-seqs)
MAX_TOKEN_COUNT = 2**31 - 1  # max_tokens, min_tokens: no context comes near
# Temperatures below this are greedy (vLLM's rule): dividing float32 logits by a smaller one overflows to inf.
MIN_SAMPLING_TEMPERATURE = 1e-5


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return (_is_int(value) or isinstance(value, float)) and math.isfinite(value)  # type: ignore[arg-type]


@dataclass(frozen=True)
class SamplingParams:
    """Per-request generation settings.

    Defaults follow vLLM: `temperature=1.0` samples, a temperature below 1e-5 (0 included) is greedy (exact
    argmax); `top_k` 0 or -1 and `top_p` 1 disable those filters; `max_tokens=None` generates up to the model's
    context. Sequences (`stop`, `stop_token_ids`) are stored as tuples and `logit_bias` as a tuple of
    `(token_id, bias)` pairs, so the object is immutable and hashable. Every invalid value raises ValueError naming
    the field and the allowed range.
    """

    n: int = 1
    best_of: int | None = None
    max_tokens: int | None = 16
    min_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] | Mapping[int, float] | None = None
    seed: int | None = None
    stop: tuple[str, ...] | str | None = ()
    stop_token_ids: tuple[int, ...] | None = ()
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    detokenize: bool = True
    structured_outputs: GrammarSpec | Mapping[str, object] | None = None

    def __post_init__(self) -> None:
        self._normalize()
        self._normalize_structured()
        self._check_counts()
        self._check_floats()
        self._check_lists()

    # -- normalisation -----------------------------------------------------------------------------------------
    def _set(self, name: str, value: object) -> None:
        object.__setattr__(self, name, value)

    def _normalize(self) -> None:
        if self.stop is None:
            self._set("stop", ())
        elif isinstance(self.stop, str):
            self._set("stop", (self.stop,))
        elif isinstance(self.stop, Iterable):
            self._set("stop", tuple(self.stop))
        if self.stop_token_ids is None:
            self._set("stop_token_ids", ())
        elif isinstance(self.stop_token_ids, Iterable):
            self._set("stop_token_ids", tuple(self.stop_token_ids))
        if self.top_k == -1:
            self._set("top_k", 0)
        if isinstance(self.logit_bias, Mapping):
            self._set("logit_bias", tuple(sorted((_bias_key(k), v) for k, v in self.logit_bias.items())))
        elif self.logit_bias is not None:
            self._set("logit_bias", tuple(_bias_entry(entry) for entry in _iterate("logit_bias", self.logit_bias)))
        if self.logit_bias == ():
            self._set("logit_bias", None)
        for name in ("temperature", "top_p", "min_p", "repetition_penalty", "frequency_penalty",
                     "presence_penalty"):
            value = getattr(self, name)
            if _is_int(value):
                self._set(name, float(value))

    # -- validation --------------------------------------------------------------------------------------------
    def _check_counts(self) -> None:
        _require_int("n", self.n, low=1, high=MAX_SEQUENCES)
        if self.best_of is not None:
            _require_int("best_of", self.best_of, low=1, high=MAX_SEQUENCES)
            if self.best_of < self.n:
                raise ParamError("best_of", f"must be >= n ({self.n}), got {self.best_of}")
        if self.max_tokens is not None:
            _require_int("max_tokens", self.max_tokens, low=1, high=MAX_TOKEN_COUNT)
        _require_int("min_tokens", self.min_tokens, low=0, high=MAX_TOKEN_COUNT)
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ParamError("min_tokens", f"must be <= max_tokens ({self.max_tokens}), got {self.min_tokens}")
        _require_int("top_k", self.top_k, low=0, note=" (0 or -1 disables it; beyond the vocabulary: all of it)")
        if self.seed is not None:
            _require_int("seed", self.seed, low=-(2**63), high=2**64 - 1)
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None:
                _require_int(name, value, low=0, high=MAX_LOGPROBS)
        for name in ("include_stop_str_in_output", "ignore_eos", "skip_special_tokens",
                     "spaces_between_special_tokens", "detokenize"):
            if not isinstance(getattr(self, name), bool):
                raise ParamError(name, f"must be a boolean, got {getattr(self, name)!r}")

    def _check_floats(self) -> None:
        _require_float("temperature", self.temperature, low=0.0, note=" (0 = greedy)")
        _require_float("top_p", self.top_p, low=0.0, high=1.0, low_open=True)
        _require_float("min_p", self.min_p, low=0.0, high=1.0)
        _require_float("repetition_penalty", self.repetition_penalty, low=0.0, low_open=True, note=" (1 = off)")
        _require_float("frequency_penalty", self.frequency_penalty, low=-2.0, high=2.0)
        _require_float("presence_penalty", self.presence_penalty, low=-2.0, high=2.0)
        for token_id, bias in self.logit_bias or ():
            if not _is_number(bias) or not -100.0 <= bias <= 100.0:
                raise ParamError("logit_bias", f"values must be numbers in [-100, 100], got {bias!r} for {token_id}")

    def _normalize_structured(self) -> None:
        value = self.structured_outputs
        if value is None or isinstance(value, GrammarSpec):
            return
        if not isinstance(value, Mapping):
            raise ParamError("structured_outputs", f"must be a GrammarSpec or a mapping, got {type(value).__name__}")
        self._set("structured_outputs", structured_spec(value))

    def _check_lists(self) -> None:
        if not isinstance(self.stop, tuple) or not all(isinstance(s, str) and s for s in self.stop):
            raise ParamError("stop", f"must be a string or a list of non-empty strings, got {self.stop!r}"[:300])
        if len(self.stop) > MAX_STOP_STRINGS or any(len(s) > MAX_STOP_STRING_CHARS for s in self.stop):
            raise ParamError("stop", f"may hold at most {MAX_STOP_STRINGS} strings of at most {MAX_STOP_STRING_CHARS} "
                             f"characters each")
        for name in ("stop_token_ids", "logit_bias"):
            if len(getattr(self, name) or ()) > MAX_TOKEN_ID_LIST:
                raise ParamError(name, f"may hold at most {MAX_TOKEN_ID_LIST} entries, got "
                                 f"{len(getattr(self, name))}")
        if self.stop and not self.detokenize:
            raise ParamError("stop", "strings are matched on the generated text, so stop needs detokenize=True")
        if not isinstance(self.stop_token_ids, tuple) or not all(
                _is_int(t) and t >= 0 for t in self.stop_token_ids):
            raise ParamError("stop_token_ids", f"must be a list of token ids >= 0, got {self.stop_token_ids!r}"[:300])

    # -- derived -----------------------------------------------------------------------------------------------
    @property
    def is_greedy(self) -> bool:
        return self.temperature < MIN_SAMPLING_TEMPERATURE

    @property
    def num_sequences(self) -> int:
        """How many sequences are generated (best_of when ranking, else n)."""
        return self.best_of if self.best_of is not None else self.n

    @property
    def logit_bias_dict(self) -> dict[int, float]:
        return dict(self.logit_bias or ())

    def to_dict(self) -> dict[str, Any]:
        """The fields that differ from their defaults, as JSON-ready values (`from_dict` rebuilds an equal object):
        tuples become lists, `logit_bias` a list of [token_id, bias] pairs, a grammar {"kind", "text"}."""
        values: dict[str, Any] = {}
        for spec in fields(self):
            value = getattr(self, spec.name)
            if value == _DEFAULTS[spec.name]:
                continue
            if isinstance(value, GrammarSpec):
                value = {"kind": value.kind, "text": value.text}
            elif isinstance(value, tuple):
                value = [list(item) if isinstance(item, tuple) else item for item in value]
            values[spec.name] = value
        return values

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> SamplingParams:
        """Inverse of `to_dict` (validated like any construction); unknown keys raise ValueError naming them."""
        unknown = set(values) - set(_DEFAULTS)
        if unknown:
            raise ParamError(sorted(unknown)[0], "is not a sampling parameter")
        values = dict(values)
        grammar = values.get("structured_outputs")
        if isinstance(grammar, Mapping) and set(grammar) == {"kind", "text"}:
            values["structured_outputs"] = GrammarSpec(grammar["kind"], grammar["text"])
        return cls(**values)

    def replace(self, **changes: object) -> SamplingParams:
        """A copy with some fields changed (validated again)."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values.update(changes)
        return SamplingParams(**values)  # type: ignore[arg-type]


def _bias_key(key: object) -> int:
    """A token id given as an int or as its decimal digits (JSON object keys are strings); not a bool, and not
    the other spellings int() reads ("+5", " 5 ", "5_0", Arabic-Indic digits)."""
    if isinstance(key, str) and key.isascii() and key.isdigit() and len(key) <= 20:  # (20 digits: past any vocab)
        return int(key)
    if isinstance(key, int) and not isinstance(key, bool):
        if key < 0:
            raise ParamError("logit_bias", f"keys must be token ids >= 0, got {key!r}")
        return key
    raise ParamError("logit_bias", f"keys must be token ids, got {key!r}")


def _bias_entry(entry: object) -> tuple[int, object]:
    if not isinstance(entry, (tuple, list)) or len(entry) != 2:
        raise ParamError("logit_bias", f"must be a mapping of token id to bias, or (token id, bias) pairs, got "
                                       f"{entry!r}")
    return _bias_key(entry[0]), entry[1]


def _iterate(name: str, value: object) -> Iterable[object]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise ParamError(name, f"must be a mapping or a list, got {type(value).__name__}")
    return value


def _require_int(name: str, value: object, low: int, high: int | None = None, note: str = "") -> None:
    if not _is_int(value) or value < low or (high is not None and value > high):  # type: ignore[operator]
        allowed = f">= {low}" if high is None else f"in [{low}, {high}]"
        # repr of a huge int is slow, or refused past Python's digit limit
        shown = f"an integer of {value.bit_length()} bits" if isinstance(value, int) and value.bit_length() > 128 \
            else repr(value)
        raise ParamError(name, f"must be an integer {allowed}{note}, got {shown}")


def _require_float(name: str, value: object, low: float, high: float | None = None, low_open: bool = False,
                   note: str = "") -> None:
    too_low = _is_number(value) and (value <= low if low_open else value < low)  # type: ignore[operator]
    too_high = _is_number(value) and high is not None and value > high  # type: ignore[operator]
    if not _is_number(value) or too_low or too_high:
        left = "(" if low_open else "["
        allowed = f"> {low}" if low_open else f">= {low}"
        if high is not None:
            allowed = f"in {left}{low}, {high}]"
        raise ParamError(name, f"must be a finite number {allowed}{note}, got {value!r}")


_STRUCTURED_KEYS = {"json": GrammarSpec.from_json_schema, "regex": GrammarSpec.from_regex,
                    "choice": GrammarSpec.from_choice, "grammar": GrammarSpec.from_ebnf}


def structured_spec(options: Mapping[str, object]) -> GrammarSpec:
    """vLLM-style structured output options -> GrammarSpec: exactly one of `json` (a schema), `regex`, `choice`
    (a list of strings), `grammar` (EBNF) or `json_object: true`."""
    chosen = {key: value for key, value in options.items() if value not in (None, False)}
    unknown = set(chosen) - {*_STRUCTURED_KEYS, "json_object"}
    if unknown:
        raise ParamError("structured_outputs", f"unknown option {sorted(unknown)[0]!r}; use one of "
                         f"json, regex, choice, grammar, json_object", ": ")
    if len(chosen) != 1:
        raise ParamError("structured_outputs", f"must set exactly one constraint, got {sorted(chosen) or 'none'}")
    key, value = next(iter(chosen.items()))
    if key == "json_object":
        return GrammarSpec.json_object()
    try:
        return _STRUCTURED_KEYS[key](value)  # type: ignore[arg-type]
    except ValueError as error:
        raise ParamError("structured_outputs", f"{error}", ": ") from None


_DEFAULTS: Mapping[str, Any] = MappingProxyType(
    {spec.name: getattr(SamplingParams(), spec.name) for spec in fields(SamplingParams)})

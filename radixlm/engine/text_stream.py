"""TextStream: the visible text of one generated sequence, token by token, with stop strings and streaming deltas.

- Text grows through the incremental detokenizer, which holds back the bytes of an unfinished multi-byte character
  (flushed, as a full decode would show them, only when the sequence ends on one).
- Stop strings are looked for once more than `min_tokens` tokens were generated (as vLLM does); the text is cut
  before the stop string, or after it with `include_stop_str_in_output`.
- `take_delta` returns the text not yet emitted, minus the end that could still turn out to be the start of a stop
  string (it would have to be taken back). So the emitted deltas always add up to the final text.
"""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase

from radixlm.engine.detokenizer import IncrementalDetokenizer
from radixlm.engine.stop_strings import find_stop, held_back_length
from radixlm.sampling_params import SamplingParams


class TextStream:
    def __init__(self, tokenizer: PreTrainedTokenizerBase, prompt_token_ids: list[int],
                 params: SamplingParams) -> None:
        self._detokenizer = IncrementalDetokenizer(tokenizer, prompt_token_ids, params.skip_special_tokens) \
            if params.detokenize else None
        self._stops: tuple[str, ...] = params.stop  # type: ignore[assignment]  # normalised to a tuple
        self._min_tokens = params.min_tokens
        self._include_stop = params.include_stop_str_in_output
        self._hold_back = bool(self._stops) and not self._include_stop
        self.text = ""
        self.stop_string: str | None = None
        self._num_emitted = 0

    def add_token(self, token_id: int, num_output_tokens: int) -> str | None:
        """Add the text of the sequence's newest token; returns the stop string it completed (text is then cut)."""
        if self._detokenizer is None or self.stop_string is not None:
            return None
        piece = self._detokenizer.add(token_id)
        self.text += piece
        if not piece or not self._stops or num_output_tokens <= self._min_tokens:
            return None
        match = find_stop(self.text, len(piece), self._stops)
        if match is None:
            return None
        self.text = self.text[:match.end if self._include_stop else match.start]
        self.stop_string = match.stop
        return match.stop

    def take_delta(self, finished: bool) -> str:
        """The text to stream now: everything new once finished, else all but a possible stop-string start.

        At the finish, bytes held back for an unfinished character are decoded as they are.
        """
        if finished and self._detokenizer is not None and self.stop_string is None:
            self.text += self._detokenizer.flush()
        end = len(self.text)
        if self._hold_back and not finished and self.stop_string is None:
            end -= held_back_length(self.text[self._num_emitted:], self._stops)
        delta = self.text[self._num_emitted:end]
        self._num_emitted = max(self._num_emitted, end)
        return delta

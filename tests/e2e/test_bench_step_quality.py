"""`radixlm bench step` and `radixlm bench quality` run end to end on a tiny model."""

from radixlm.bench.quality import bench_quality
from radixlm.bench.step import StepGrid, bench_step
from radixlm.bench.step_prefill import bench_prefill
from radixlm.bench.step_probe import StepProbe, linear_modules, weight_bytes
from radixlm.engine.llm_engine import build_engine
from radixlm.model.prepacked_linear import prepacking_available
from radixlm.sample.sampler import Sampler
from radixlm.sampling_params import SamplingParams


def test_bench_step_reports_every_part(tiny_model_dir, capsys):
    grid = StepGrid(batch_sizes=(1, 3), context_lens=(48,), shared_prefix=(False, True), num_steps=2)
    rows = bench_step({"model": str(tiny_model_dir("llama")), "quantization": "int8"}, grid)
    assert [(r.batch_size, r.shared_prefix) for r in rows] == [(1, False), (3, False), (1, True), (3, True)]
    for row in rows:
        assert row.ms["step"] >= row.ms["execute"] >= row.ms["forward"] >= row.ms["attention"] > 0
        assert row.ms["forward"] >= row.ms["linears"] > 0 and row.ms["sampler"] > 0 and row.ms["scheduler"] > 0
        assert row.attention_bound_ms > 0 and row.linears_bound_ms > 0
    assert rows[1].attention_bound_ms > rows[0].attention_bound_ms  # three contexts read instead of one
    assert "| 3 | 48 | shared |" in capsys.readouterr().out


def test_bench_prefill_breaks_one_chunk_down_and_counts_bfloat16_serving_linears(tiny_model_dir, capsys):
    options = {"model": str(tiny_model_dir("llama")), "dtype": "bfloat16", "max_num_batched_tokens": 16,
               "num_kv_blocks": 64}
    [(length, ms)] = bench_prefill(options, (40,), num_steps=2)  # the budget rises to the prompt
    assert length == 40
    assert ms["step"] >= ms["execute"] >= ms["forward"] >= ms["linears"] > 0 and ms["attention"] > 0
    assert "| 40 |" in capsys.readouterr().out
    engine = build_engine(**options)
    linears = linear_modules(engine.runner.model)
    packed = [m for m in linears if type(m).__name__ in ("PrepackedLinear", "Bf16Linear", "DotPackedLinear")]
    widened = [m for m in linears if type(m).__name__ == "WidenedLinear"]
    # On an AVX2-only CPU oneDNN takes no bfloat16, and the linears are widened by blocks instead.
    assert bool(packed) == prepacking_available() != bool(widened)
    assert weight_bytes(engine.runner.model) >= sum(2 * m.in_features * m.out_features for m in packed + widened)


def test_step_probe_times_each_linear_forward_and_leaves_the_model_as_it_found_it(tiny_model_dir):
    engine = build_engine(model=str(tiny_model_dir("llama")), quantization="int8", num_kv_blocks=16)
    engine.add_request("a", [5, 6, 7], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
    modules = linear_modules(engine.runner.model)
    probe = StepProbe(engine)
    probe.step()
    assert probe.totals["forward"] >= probe.totals["linears"] > 0
    assert all("forward" in vars(module) and not module._forward_hooks for module in modules)  # wrapped, not hooked
    probe.close()
    assert not any("forward" in vars(module) for module in modules)
    probe.reset()
    engine.step()
    assert not probe.totals


def test_bench_quality_of_the_reference_against_itself_and_of_int8(tiny_model_dir):
    model = str(tiny_model_dir("llama"))
    same = bench_quality({"model": model, "num_kv_blocks": 256}, num_prompts=4, num_tokens=8, window=64)
    assert same.identical_fraction == 1.0 and same.mean_matching_prefix == 8
    assert same.mean_logprob_delta == 0.0 and same.num_text_tokens > 1000
    assert same.top1_agreement >= 0.95  # its own answers, teacher-forced: prefill rows instead of decodes
    int8 = bench_quality({"model": model, "quantization": "int8", "num_kv_blocks": 256}, num_prompts=4,
                         num_tokens=8, window=64)
    assert 0 < int8.mean_abs_logprob_delta < 1.0
    assert 0 <= int8.identical_fraction <= 1


def test_step_probe_keeps_one_sampler_call_a_step(tiny_model_dir, monkeypatch):
    """The probe's stand-in for the sampler answers the worker's other questions to it, so a step of several greedy
    rows still samples them in one call (a bare function there sent every step down the row-by-row retry)."""
    engine = build_engine(model=str(tiny_model_dir("llama")), num_kv_blocks=16)
    for name in "abc":
        engine.add_request(name, [5, 6, 7], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
    rows_per_call: list[int] = []
    original = Sampler.__call__

    def counted(self, logits, requests, grammar_mask=None):
        rows_per_call.append(len(requests))
        return original(self, logits, requests, grammar_mask)

    monkeypatch.setattr(Sampler, "__call__", counted)
    probe = StepProbe(engine)
    probe.step()
    probe.step()
    probe.close()
    assert rows_per_call == [3, 3] and probe.totals["sampler"] > 0
    assert isinstance(engine.worker.sampler, Sampler)  # put back

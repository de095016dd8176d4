"""The pre-training loop: exact resume, phase 2, non-finite steps, the CLI and its outputs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tests.train.conftest import logged_losses, saved_weights
from tests.train.conftest import tiny_config as _cfg

from bertforge.cli import main
from bertforge.config import load_config
from bertforge.errors import UserError
from bertforge.train import checkpoint as ckpt
from bertforge.train.loop import run_pretrain


@pytest.fixture(autouse=True)
def _ov(overrides):
    global tiny_overrides
    tiny_overrides = overrides


def test_exact_resume(shards, tmp_path):
    """N steps + stop + resume + N steps == 2N uninterrupted steps, bitwise (CPU, fp32), losses too."""
    full = tmp_path / "full"
    run_pretrain(_cfg(shards, full))
    split = tmp_path / "split"
    first = run_pretrain(_cfg(shards, split, **{"train.stop_after_steps": 3}))
    assert first["step"] == 3
    second = run_pretrain(_cfg(shards, split), resume=True)
    assert second["step"] == 6
    a, b = saved_weights(full), saved_weights(split)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert logged_losses(full) == logged_losses(split)
    assert sorted(logged_losses(full)) == [1, 2, 3, 4, 5, 6]
    # the optimizer state matches too
    sa = ckpt.latest_checkpoint(full / "checkpoints").load_state()
    sb = ckpt.latest_checkpoint(split / "checkpoints").load_state()
    for i, st in sa["optimizer"]["state"].items():
        assert torch.equal(st["exp_avg_sq"], sb["optimizer"]["state"][i]["exp_avg_sq"])
    drop = lambda s: {k: v for k, v in s["train_state"].items() if k != "train_seconds"}  # noqa: E731
    assert drop(sa) == drop(sb)


def test_a_shard_dir_without_rows_is_refused_before_anything_is_written(shards, tmp_path):
    """A corpus too small to hold any document out gives eval shards of 0 rows; evaluating them would log loss 0
    and accuracy 0 as if measured. Training shards of 0 rows (documents too short for seq_len) would never
    give a batch."""
    import h5py

    empty = tmp_path / "eval"
    empty.mkdir()
    with h5py.File(shards / "shard_0.hdf5") as src, h5py.File(empty / "eval_0.hdf5", "w") as h:
        for k, v in src.items():
            h.create_dataset(k, shape=(0, *v.shape[1:]), dtype=v.dtype)
    with pytest.raises(UserError, match=f"data.eval_dir {empty} holds no rows"):
        run_pretrain(_cfg(shards, tmp_path / "run", **{"data.eval_dir": str(empty)}))
    assert not (tmp_path / "run").exists()
    with pytest.raises(UserError, match=f"data.input_dir {empty} holds no rows .*seq_len"):
        run_pretrain(_cfg(empty, tmp_path / "run"))
    assert not (tmp_path / "run").exists()


def test_phase2_from_phase1(shards, tmp_path, capsys):
    p1 = tmp_path / "p1"
    run_pretrain(_cfg(shards, p1, **{"train.max_steps": 3}))
    p2 = tmp_path / "p2"
    capsys.readouterr()
    summary = run_pretrain(
        _cfg(
            shards,
            p2,
            **{"train.max_steps": 4, "train.init_checkpoint": str(p1), "train.save_every": 2, "optim.lr": 5e-4},
        )
    )
    assert summary["phase"] == 2 and summary["step"] == 4 and summary["global_step"] == 7
    out = capsys.readouterr().out  # progress counts run-wide steps over the run-wide total, never past 100%
    assert "step 4/7 (57%)" in out and "step 7/7 (100%)" in out, out
    names = [c.path.name for c in ckpt.list_checkpoints(p2 / "checkpoints")]
    assert names == ["step_00000005", "step_00000007"]  # run-wide steps: phase-1's 3 + phase-2's
    state = ckpt.latest_checkpoint(p2 / "checkpoints").load_state()
    assert state["optimizer"]["param_groups"][0]["step"] == 4  # reset at the phase start, then 4 updates
    assert state["train_state"]["phase_offset"] == 3
    # phase 2's own schedule: its step 1 (progress 1/4, past the 0.2 warmup) logged at run-wide step 4
    rows = [json.loads(x) for x in (p2 / "metrics.jsonl").read_text().splitlines()]
    first = next(r for r in rows if "lr" in r)
    assert first["step"] == 4 and first["lr"] == pytest.approx(5e-4 * (1 - 1 / 4) ** 0.5)
    # resume in the middle of phase 2 continues phase 2 (not phase 1, not a fresh phase 2)
    mid = tmp_path / "mid"
    run_pretrain(
        _cfg(
            shards,
            mid,
            **{"train.max_steps": 4, "train.init_checkpoint": str(p1), "train.stop_after_steps": 2, "optim.lr": 5e-4},
        )
    )
    resumed = run_pretrain(
        _cfg(shards, mid, **{"train.max_steps": 4, "train.init_checkpoint": str(p1), "optim.lr": 5e-4}), resume=True
    )
    assert resumed["phase"] == 2 and resumed["global_step"] == 7
    a, b = saved_weights(p2), saved_weights(mid)
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_init_from_takes_the_checkpoints_shape_and_this_configs_dropout(shards, tmp_path, capsys):
    """model.init_from: the checkpoint's config.json decides the shape, and a preset or position count that
    differs is said, not silently dropped; the config's dropout rates replace the checkpoint's (0.0 here)."""
    run_pretrain(_cfg(shards, tmp_path / "p1", **{"train.max_steps": 1}))
    model_dir = ckpt.latest_checkpoint(tmp_path / "p1" / "checkpoints").model_dir
    capsys.readouterr()
    extra = {"model.init_from": str(model_dir), "model.preset": "mini", "model.hidden_dropout": 0.25}
    run_pretrain(_cfg(shards, tmp_path / "p2", **{"train.max_steps": 1, **extra}))
    out = capsys.readouterr().out
    assert "its config.json decides the model's shape, not model.preset mini" in out
    assert "hidden_size 256" in out and "num_hidden_layers 4" in out, out
    assert f"pretrain phase 1: {model_dir} (2 layers, hidden 128," in out  # the banner names what runs, not "mini"
    summary = json.loads((tmp_path / "p2" / "summary.json").read_text())
    assert summary["model_preset"] is None and summary["model"].startswith(str(model_dir))
    config = json.loads((ckpt.latest_checkpoint(tmp_path / "p2" / "checkpoints").model_dir / "config.json").read_text())
    assert config["hidden_size"] == 128 and config["hidden_dropout_prob"] == 0.25
    assert config["attention_probs_dropout_prob"] == 0.0


def test_rows_longer_than_the_init_from_models_positions_name_the_checkpoint(shards, tmp_path):
    """The advice was to raise model.max_position_embeddings, which init_from does not use."""
    run_pretrain(_cfg(shards, tmp_path / "p1", **{"train.max_steps": 1, "model.max_position_embeddings": 32}))
    model_dir = ckpt.latest_checkpoint(tmp_path / "p1" / "checkpoints").model_dir
    longer = {"data.input_dir": "synthetic", "data.synthetic_seq_len": 48, "data.synthetic_max_pred": 5}
    with pytest.raises(UserError) as e:
        run_pretrain(_cfg(shards, tmp_path / "p2", **{"train.max_steps": 1, "model.init_from": model_dir, **longer}))
    assert f"rows have 48 tokens but model.init_from {model_dir} has 32 positions" in str(e.value)


def test_a_modernbert_init_from_extends_its_context_and_takes_the_rotary_base(shards, tmp_path):
    """ModernBERT has no position table: a phase from model.init_from may run rows longer than the checkpoint's
    max_position_embeddings (the preset's count is recorded), with the configured global rotary base; a BERT
    init_from with a rotary base is refused before its weights are read."""
    modern = {
        "model.preset": "modernbert-tiny",
        "train.objective": "mlm",
        "data.input_dir": "synthetic",
        "data.synthetic_seq_len": 32,
        "data.synthetic_max_pred": 5,
        "data.synthetic_vocab_size": 100,
        "model.vocab_size": 128,
        "train.max_steps": 1,
    }
    run_pretrain(_cfg(shards, tmp_path / "p1", **{**modern, "model.max_position_embeddings": 32}))
    model_dir = ckpt.latest_checkpoint(tmp_path / "p1" / "checkpoints").model_dir
    longer = {**modern, "data.synthetic_seq_len": 48, "model.init_from": str(model_dir)}
    run_pretrain(_cfg(shards, tmp_path / "p2", **{**longer, "model.global_rope_theta": 20000.0}))
    config = json.loads((ckpt.latest_checkpoint(tmp_path / "p2" / "checkpoints").model_dir / "config.json").read_text())
    assert config["max_position_embeddings"] == 64 and config["global_rope_theta"] == 20000.0
    # --resume with the rotary base changed is refused; null and the default it stands for are the same base
    with pytest.raises(UserError, match="model.global_rope_theta 20000.0 -> 30000.0"):
        run_pretrain(_cfg(shards, tmp_path / "p2", **{**longer, "model.global_rope_theta": 30000.0}), resume=True)
    p1 = {**modern, "model.max_position_embeddings": 32, "model.global_rope_theta": 160000.0}
    assert run_pretrain(_cfg(shards, tmp_path / "p1", **p1), resume=True)["step"] == 1  # finished: resumes, no step
    run_pretrain(_cfg(shards, tmp_path / "b1", **{"train.max_steps": 1}))
    bert = ckpt.latest_checkpoint(tmp_path / "b1" / "checkpoints").model_dir
    with pytest.raises(UserError, match="global_rope_theta is a ModernBERT setting; .* is a bert model"):
        run_pretrain(_cfg(shards, tmp_path / "b2", **{"model.init_from": str(bert), "model.global_rope_theta": 1e4}))


def test_nonfinite_steps_stop_with_checkpoint(shards, tmp_path):
    out = tmp_path / "nan"
    cfg = _cfg(
        shards,
        out,
        **{
            "train.max_nonfinite_steps": 2,
            "optim.lr": 1e30,
            "optim.warmup": 0.0,
            "optim.name": "adamw",
            "train.save_every": 100,
        },
    )
    with pytest.raises(UserError, match="non-finite gradient steps in a row"):
        run_pretrain(cfg)
    saved = ckpt.latest_checkpoint(out / "checkpoints")
    assert saved is not None
    state = saved.load_state()["train_state"]
    assert state["skipped"] == 2 and state["batches"] == state["step"] + 2
    w = load_file(str(saved.model_dir / "model.safetensors"))
    assert all(torch.isfinite(v).all() for v in w.values())  # usable: the skipped steps changed nothing


def test_cli_outputs_and_transformers_loads(shards, tmp_path, capsys):
    out = tmp_path / "cli"
    js = tmp_path / "dll.json"
    rc = main(
        [
            "pretrain",
            "--config",
            "demo_tiny_128",
            "--json-summary",
            str(js),
            *[
                "--set=" + s
                for s in tiny_overrides(
                    shards,
                    out,
                    **{
                        "train.max_steps": 3,
                        "data.eval_dir": str(shards),
                        "data.eval_batches": 2,
                        "train.plot": True,
                        "train.tensorboard": True,
                    },
                )
            ],
        ]
    )
    assert rc == 0
    assert "done: phase 1 step 3" in capsys.readouterr().out
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert {"step", "loss", "mlm_acc", "lr", "seq_per_s"} <= set(rows[0])
    summary = json.loads((out / "summary.json").read_text())
    assert summary["step"] == 3 and "final_eval_mlm_acc" in summary
    assert (out / "metrics.png").is_file() and (out / "config.yaml").is_file()
    assert any((out / "tensorboard").iterdir())
    lines = js.read_text().splitlines()
    assert all(line.startswith("DLLL {") for line in lines)
    assert json.loads(lines[0][5:])["type"] == "PARAMETER"
    transformers = pytest.importorskip("transformers")
    m = transformers.BertForPreTraining.from_pretrained(summary["model_dir"])
    assert m.config.vocab_size == 64


def test_batch_that_does_not_divide(shards, tmp_path):
    with pytest.raises(UserError, match="global_batch_size"):
        run_pretrain(_cfg(shards, tmp_path / "x", **{"train.global_batch_size": 12, "train.micro_batch_size": 8}))


def test_packed_shards_train(tmp_path):
    """Packed rows (2 sequences each): the update takes global / avg_seq_per_sample packs, counts sequences."""
    import h5py
    import numpy as np

    d = tmp_path / "packed"
    d.mkdir()
    rng = np.random.default_rng(0)
    N, S = 16, 32
    ids = np.zeros((N, S), np.int32)
    mask = np.zeros((N, S), np.int8)
    pos = np.zeros((N, S), np.int32)
    mpos = np.zeros((N, 6), np.int32)
    mids = np.zeros((N, 6), np.int32)
    for r in range(N):
        for k, off in enumerate((0, 14)):
            body = rng.integers(5, 64, 10)
            ids[r, off : off + 12] = [2, *body, 3]
            mask[r, off : off + 12] = k + 1
            pos[r, off : off + 12] = range(12)
            mpos[r, 3 * k : 3 * k + 3] = off + 1 + np.arange(3)
            mids[r, 3 * k : 3 * k + 3] = ids[r, off + 1 : off + 4]
            ids[r, off + 1 : off + 4] = 4
    with h5py.File(d / "packed_0.hdf5", "w") as h:
        for k, v in {
            "input_ids": ids,
            "input_mask": mask,
            "segment_ids": np.zeros_like(mask),
            "positions": pos,
            "masked_lm_positions": mpos,
            "masked_lm_ids": mids,
            "next_sentence_positions": np.tile([0, 14], (N, 1)).astype(np.int32),
            "next_sentence_labels": np.zeros((N, 2), np.int8),
            "next_sentence_weights": np.ones((N, 2), np.int8),
        }.items():
            h.create_dataset(k, data=v)
    (d / "packing.json").write_text(json.dumps({"avg_seq_per_sample": 2.0}))
    summary = run_pretrain(
        _cfg(d, tmp_path / "run", **{"train.max_steps": 2, "train.global_batch_size": 8, "train.micro_batch_size": 2})
    )
    assert summary["sequences"] == 2 * 8  # 4 packs x 2 sequences per update


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_runs(shards, tmp_path, precision):
    """bf16 autocast and fp16 with dynamic loss scaling train on CPU (GPUs use them; the lead checks CUDA)."""
    summary = run_pretrain(
        _cfg(
            shards,
            tmp_path / precision,
            **{"train.max_steps": 2, "train.precision": precision, "train.save_every": 100},
        )
    )
    assert summary["precision"] == precision and summary["step"] == 2
    assert summary["final_loss"] is not None and summary["final_loss"] == summary["final_loss"]  # not NaN
    state = ckpt.latest_checkpoint(tmp_path / precision / "checkpoints").load_state()
    if precision == "fp16":
        assert state["scaler"]["scale"] > 0  # the scaler's state is saved for resume


def test_a_bf16_run_resumes_in_fp16(shards, tmp_path, capsys):
    """precision auto is bf16 on an H100 and fp16 on an older GPU: a run resumed on the other machine loaded
    bf16's empty scaler state into fp16's and stopped with torch's RuntimeError."""
    sets = {"train.max_steps": 4, "train.save_every": 2}
    run_pretrain(_cfg(shards, tmp_path / "r", **sets, **{"train.precision": "bf16", "train.stop_after_steps": 2}))
    summary = run_pretrain(_cfg(shards, tmp_path / "r", **sets, **{"train.precision": "fp16"}), resume=True)
    assert summary["step"] == 4 and "fp16 starts a fresh loss scale" in capsys.readouterr().out


@pytest.mark.parametrize("pack", [0, 3])
def test_synthetic_source_trains_and_profiles(tmp_path, overrides, pack, capsys):
    """`data.input_dir: synthetic` trains with no shards at all (unpacked and packed), and `--profile N` writes
    a Perfetto trace and the top-kernel table through the real CLI."""
    from bertforge.cli import main
    from bertforge.runtime.metrics import read_jsonl

    out = tmp_path / "run"
    sets = overrides(
        "synthetic",
        out,
        **{
            "data.synthetic_seq_len": 64,
            "data.synthetic_max_pred": 8,
            "data.synthetic_vocab_size": 64,
            "data.synthetic_pack": pack,
            "train.max_steps": 4,
            "train.save_every": 0,
        },
    )
    assert (
        main(["pretrain", "--config", "demo_tiny_128", "--profile", "2", *(x for s in sets for x in ("--set", s))]) == 0
    )
    rows = [r for r in read_jsonl(out / "metrics.jsonl") if "loss" in r]
    assert len(rows) == 4 and all(math.isfinite(r["loss"]) and r["mfu"] > 0 for r in rows)
    if pack:  # packed rows carry more than one sequence each
        assert rows[-1]["seq_per_s"] > rows[-1]["rows_per_s"]
    trace = json.loads((out / "profile" / "trace.json").read_text())
    assert trace["traceEvents"] and (out / "profile" / "top_ops.txt").read_text().strip()
    parts = json.loads((out / "profile" / "step_parts.json").read_text())  # the 2 steps after the warm-up one
    assert list(parts) == ["forward", "backward", "clip", "optimizer", "between"]
    assert sum(v["share"] for v in parts.values()) == pytest.approx(1.0)
    assert parts["forward"]["ms"] > 0 and parts["backward"]["ms"] > 0 and parts["optimizer"]["ms"] > 0
    assert not (out / "checkpoints").exists()  # train.save_every=0: a benchmark run writes no checkpoint
    assert "model: not saved (train.save_every=0)" in capsys.readouterr().out  # not "model: None"


def test_bad_eval_dir_and_too_long_rows_fail_at_start_up(shards, tmp_path, overrides):
    with pytest.raises(UserError, match="does not exist"):
        run_pretrain(_cfg(shards, tmp_path / "a", **{"data.eval_dir": str(tmp_path / "nope")}))
    with pytest.raises(UserError, match="max_position_embeddings"):
        run_pretrain(_cfg(shards, tmp_path / "b", **{"model.max_position_embeddings": 16}))
    assert not (tmp_path / "a" / "checkpoints").exists() and not (tmp_path / "b" / "checkpoints").exists()


def test_compile_without_its_toolchain_fails_before_anything_is_built(shards, tmp_path, monkeypatch):
    """torch.compile builds kernels at the first step (a C++ compiler on the CPU): a machine without one is
    told at start-up, naming the setting, and no output directory is left behind."""
    from torch._inductor import cpp_builder
    from torch._inductor.exc import InvalidCxxCompiler

    def no_compiler():
        raise InvalidCxxCompiler

    monkeypatch.setattr(cpp_builder, "get_cpp_compiler", no_compiler)
    out = tmp_path / "run"
    with pytest.raises(UserError, match=r"optim.compile: torch.compile on the CPU .* C\+\+ compiler"):
        run_pretrain(_cfg(shards, out, **{"optim.compile": True}))
    with pytest.raises(UserError, match=r"train.compile and optim.compile: "):
        run_pretrain(_cfg(shards, out, **{"optim.compile": True, "train.compile": True}))
    assert not out.exists()


def test_cuda_graphs_need_the_compiled_step_and_a_cuda_device(shards, tmp_path):
    from bertforge.config import ConfigError, compile_mode

    with pytest.raises(ConfigError, match="set train.compile=true as well"):
        _cfg(shards, tmp_path / "a", **{"train.cuda_graphs": True})
    with pytest.raises(ConfigError, match="needs a CUDA device; train.device is 'cpu'"):
        _cfg(shards, tmp_path / "a", **{"train.cuda_graphs": True, "train.compile": True, "train.device": "cpu"})
    cfg = _cfg(shards, tmp_path / "a", **{"train.cuda_graphs": True, "train.compile": True, "train.device": "auto"})
    assert compile_mode(cfg.train) == "reduce-overhead"
    if not torch.cuda.is_available():  # auto resolved to the CPU: refused before anything is built
        with pytest.raises(UserError, match="train.cuda_graphs needs a CUDA device; this run is on cpu"):
            run_pretrain(cfg)
        assert not (tmp_path / "a").exists()


def test_auto_fast_paths_are_decided_at_start_and_recorded(shards, tmp_path, capsys, monkeypatch, overrides):
    """The auto switches (train.compile, train.cuda_graphs, optim.compile) are made true or false before the
    first step, from the machine (`compiles_fast`) and the data: config.yaml records what ran, not auto, and
    the start-up line says how the step runs. On the CPU the run is eager. With the gate open (as on one CUDA
    device that Triton builds for) the same config compiles the step and LAMB, without CUDA graphs on unpacked
    rows; on packed rows it asks for CUDA graphs too, which this CPU refuses at start-up."""
    import yaml

    from bertforge import device as dev

    def decided(run: Path) -> tuple[bool, bool, bool]:
        saved = yaml.safe_load((run / "config.yaml").read_text())
        return saved["train"]["compile"], saved["train"]["cuda_graphs"], saved["optim"]["compile"]

    run_pretrain(_cfg(shards, tmp_path / "cpu"))
    assert decided(tmp_path / "cpu") == (False, False, False)
    assert "; step: eager\n" in capsys.readouterr().out
    monkeypatch.setattr(dev, "compiles_fast", lambda device, distributed: True)
    run_pretrain(_cfg(shards, tmp_path / "fast", **{"train.max_steps": 2, "train.attention": "auto"}))
    assert decided(tmp_path / "fast") == (True, False, True)
    assert "; step: compiled (model scope), LAMB compiled\n" in capsys.readouterr().out
    packed = {"data.synthetic_seq_len": 64, "data.synthetic_vocab_size": 64, "data.synthetic_pack": 3}
    cfg = load_config("pretrain", None, overrides("synthetic", tmp_path / "packed", **packed))
    with pytest.raises(UserError, match="train.cuda_graphs needs a CUDA device; this run is on cpu"):
        run_pretrain(cfg)
    assert not (tmp_path / "packed").exists()


def test_the_cpu_fast_paths_in_the_loop_track_eager_and_resume_exactly(shards, tmp_path):
    """`bertforge pretrain` itself with train.compile and optim.compile (CPU, fp32, no dropout): the losses of
    the eager loop within 1e-4 relative; stop + resume with them on is still bitwise."""
    fast = {"train.compile": True, "optim.compile": True}
    run_pretrain(_cfg(shards, tmp_path / "eager"))
    run_pretrain(_cfg(shards, tmp_path / "fast", **fast))
    eager, compiled = logged_losses(tmp_path / "eager"), logged_losses(tmp_path / "fast")
    assert sorted(compiled) == [1, 2, 3, 4, 5, 6]
    assert all(abs(compiled[s] - eager[s]) <= 1e-4 * eager[s] for s in eager), (eager, compiled)
    split = tmp_path / "split"
    run_pretrain(_cfg(shards, split, **fast, **{"train.stop_after_steps": 3}))
    run_pretrain(_cfg(shards, split, **fast), resume=True)
    a, b = saved_weights(tmp_path / "fast"), saved_weights(split)
    assert all(torch.equal(a[k], b[k]) for k in a) and logged_losses(split) == compiled


def test_the_loop_compiles_layer_by_layer_with_eager_losses(shards, tmp_path, capsys):
    """train.compile_scope=layers in `bertforge pretrain` (CPU, fp32, no dropout): each encoder layer compiled
    on its own, the loss of every step within 1e-4 relative of the eager loop's, and the checkpoint's keys
    those of an eager run (the layers are compiled in place); the wait for the compile is announced."""
    run_pretrain(_cfg(shards, tmp_path / "eager"))
    assert "compiling the step" not in capsys.readouterr().out
    run_pretrain(_cfg(shards, tmp_path / "layers", **{"train.compile": True, "train.compile_scope": "layers"}))
    assert "compiling the step (layers scope): the first step waits for it\n" in capsys.readouterr().out
    eager, layers = logged_losses(tmp_path / "eager"), logged_losses(tmp_path / "layers")
    assert sorted(layers) == [1, 2, 3, 4, 5, 6]
    assert all(abs(layers[s] - eager[s]) <= 1e-4 * eager[s] for s in eager), (eager, layers)
    assert saved_weights(tmp_path / "layers").keys() == saved_weights(tmp_path / "eager").keys()


def test_the_loop_runs_layernorm_in_bf16_with_the_losses_of_fp32_norms(shards, tmp_path):
    """train.low_precision_layernorm in `bertforge pretrain` (CPU, bf16 autocast): the losses of the same bf16
    run with autocast's fp32 LayerNorms within bf16 rounding, and the checkpoint's keys unchanged."""
    bf16 = {"train.precision": "bf16", "train.save_every": 6}
    run_pretrain(_cfg(shards, tmp_path / "fp32_norms", **bf16))
    run_pretrain(_cfg(shards, tmp_path / "bf16_norms", **bf16, **{"train.low_precision_layernorm": True}))
    ref, low = logged_losses(tmp_path / "fp32_norms"), logged_losses(tmp_path / "bf16_norms")
    assert sorted(low) == [1, 2, 3, 4, 5, 6]
    assert all(abs(low[s] - ref[s]) <= 0.02 * ref[s] for s in ref), (ref, low)
    assert saved_weights(tmp_path / "bf16_norms").keys() == saved_weights(tmp_path / "fp32_norms").keys()


def test_evaluation_in_the_segmented_layout_scores_as_unpadded(shards, flash_stand_in):
    """A run whose batches carry segment bounds evaluates held-out batches with them too (a compiled model
    keeps the layout it was compiled for); the scores equal the unpadded layout's. A per-segment reference
    stands in for the CUDA flash kernel."""
    from bertforge.model import BertConfig, build_model
    from bertforge.runtime.distributed import DistInfo
    from bertforge.train.loop import evaluate

    from .conftest import VOCAB

    torch.manual_seed(0)
    model = build_model(BertConfig.from_preset("tiny", vocab_size=VOCAB, max_position_embeddings=64), "pretraining")
    cpu = torch.device("cpu")
    args = (shards, cpu, "fp32", 16, 2, DistInfo(), VOCAB, 1)
    unpadded = evaluate(model, *args)
    assert flash_stand_in and all(indices is not None for _, indices, _ in flash_stand_in)
    flash_stand_in.clear()
    segmented = evaluate(model, *args, segments=True)
    assert flash_stand_in and all(indices is None for _, indices, _ in flash_stand_in)
    assert segmented == pytest.approx(unpadded, abs=1e-6)


def test_a_run_in_the_segmented_layout_trains_as_unpadded(shards, tmp_path, flash_stand_in, monkeypatch):
    """The whole loop with bounds in its batches (loader, step, held-out evaluation): the same losses and scores
    as the unpadded layout, with the per-segment reference standing in for the CUDA flash kernel."""
    from bertforge.train import loop

    extra = {"data.eval_dir": str(shards), "train.eval_every": 3}
    run_pretrain(_cfg(shards, tmp_path / "unpadded", **extra))
    assert all(indices is not None for _, indices, _ in flash_stand_in)
    flash_stand_in.clear()
    monkeypatch.setattr(loop, "wants_segments", lambda *a, **k: True)  # as on CUDA with train.attention=auto
    run_pretrain(_cfg(shards, tmp_path / "segmented", **extra))
    assert flash_stand_in and all(indices is None for _, indices, _ in flash_stand_in)
    assert logged_losses(tmp_path / "segmented") == pytest.approx(logged_losses(tmp_path / "unpadded"), abs=1e-5)
    evals = [_evals(tmp_path / name) for name in ("unpadded", "segmented")]
    assert evals[0] and evals[1] == pytest.approx(evals[0], abs=1e-5)


def _evals(run: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["eval_mlm_acc"] for r in rows if "eval_mlm_acc" in r}


def test_each_window_keeps_the_device_time_it_waited_for(shards, tmp_path, monkeypatch):
    """A logged window ends with a device sync (the update's optimizer kernels finishing on a GPU). That time is
    the window's; the next window starts after it, and after the log line. It used to be subtracted from the
    next window as if it were pause: every window after the first came out short by it, and seq/s and MFU high
    (here a 0.3 s sync stands in for the device; the CPU step itself takes a few ms)."""
    import time

    from bertforge import device as dev

    monkeypatch.setattr(dev, "synchronize", lambda device=None: time.sleep(0.3))
    # MFU's matmul peak is measured with synchronize: not here, or the session's cache would keep a 0.3 s matmul
    monkeypatch.setattr(dev, "peak_flops", lambda device, precision: 1e12)
    run_pretrain(_cfg(shards, tmp_path / "r", **{"train.max_steps": 4, "train.save_every": 0}))
    rows = [json.loads(line) for line in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    windows = [r["window_s"] for r in rows if "window_s" in r]
    assert len(windows) == 4 and min(windows) >= 0.3, windows
    assert all(r["data_wait"] >= 0 for r in rows if "data_wait" in r)


def test_the_held_out_loss_does_not_depend_on_the_batch_size(tmp_path):
    """eval_loss is the held-out set's loss (MLM per masked token + NSP per pair), as one batch of every row
    gives it: a mean of per-batch means gave a short last batch (here 1 row of 5) the weight of a full one."""
    from bertforge.model import BertConfig, build_model
    from bertforge.runtime.distributed import DistInfo
    from bertforge.train.loop import evaluate

    from .conftest import VOCAB, make_shards

    held_out = make_shards(tmp_path / "held_out", n_shards=1, rows=5)
    torch.manual_seed(0)
    model = build_model(BertConfig.from_preset("tiny", vocab_size=VOCAB, max_position_embeddings=64), "pretraining")
    with torch.no_grad():  # rows then differ in loss far more than a random model's near-uniform guesses do
        for p in model.parameters():
            p.mul_(8.0)
    cpu = torch.device("cpu")
    whole = evaluate(model, held_out, cpu, "fp32", 5, 0, DistInfo(), VOCAB, 1)
    batched = evaluate(model, held_out, cpu, "fp32", 4, 0, DistInfo(), VOCAB, 1)
    assert batched == pytest.approx(whole, rel=1e-6)


def test_a_stop_between_log_lines_logs_its_last_steps(shards, tmp_path):
    """train.stop_after_steps between two log lines: the steps since the last line get a row of their own and
    the summary's final loss is theirs (it was the previous line's, and the stop step's loss was nowhere)."""
    out = tmp_path / "r"
    summary = run_pretrain(_cfg(shards, out, **{"train.log_every": 2, "train.stop_after_steps": 3}))
    losses = logged_losses(out)
    assert sorted(losses) == [2, 3] and summary["step"] == 3 and summary["final_loss"] == losses[3]
    run_pretrain(_cfg(shards, out, **{"train.log_every": 2}), resume=True)
    assert sorted(logged_losses(out)) == [2, 3, 4, 6]


def test_resume_drops_the_json_summarys_rows_after_the_checkpoint(shards, tmp_path):
    """--json-summary (dllogger's format) keeps each step once after a resume, as metrics.jsonl does: the rows
    of steps that run again used to stay beside the new ones."""
    import shutil

    out, dll = tmp_path / "r", tmp_path / "dll.json"
    run_pretrain(_cfg(shards, out, **{"train.stop_after_steps": 5}), json_summary=str(dll))
    shutil.rmtree(ckpt.latest_checkpoint(out / "checkpoints").path)  # back to step 3: steps 4 and 5 run again
    run_pretrain(_cfg(shards, out), resume=True, json_summary=str(dll))
    records = [json.loads(line.removeprefix("DLLL ")) for line in dll.read_text().splitlines()]
    steps = [r["step"] for r in records if r["type"] == "LOG" and "loss" in r["data"]]
    assert steps == [1, 2, 3, 4, 5, 6] and sorted(logged_losses(out)) == steps
    assert [r["type"] for r in records].count("PARAMETER") == 2  # each start's configuration stays

"""`sss fit --engine ray`: the unchanged fit in Ray Train workers trains Accelerate's 2-process weights bit for bit,
a worker killed with kill -9 is replaced and the run continues from its newest checkpoint to the same weights,
and the flags and a missing Ray are refused in one line. One local Ray instance serves the module."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from sss.cli import main
from sss.config import load_config

EXAMPLE = str(Path(__file__).parents[2] / "examples" / "industrial.yaml")
MANIFEST = str(Path(__file__).parents[2] / "examples" / "manifest.yaml")
SCRIPTS = Path(__file__).parents[1] / "scripts"  # ray_kill.py: the KillPoint callback
# 48 samples / (2 workers x 8) = 3 steps an epoch; a checkpoint at each epoch's end (the example's every_epoch)
SHORT = [
    "model.name=hunter_tiny",
    "data.n_train=48",
    "data.n_val=16",
    "data.n_test=8",
    "data.batch_size=8",
    "trainer.max_steps=12",
    "trainer.log.progress=false",
    "trainer.log.plots=false",
    "trainer.log.trackers=[csv]",
    "trainer.log.every_n_steps=2",
    "trainer.checkpoint.keep_last=4",  # step_0000003, which the killed run resumes, stays to the end
]


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(str(folder / "model" / "model.safetensors"))


def _equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def ray_instance(tmp_path_factory):
    """A local Ray instance of 2 CPUs whose workers import tests/scripts; the data cache of the module."""
    import ray

    cache = tmp_path_factory.mktemp("cache")
    mp = pytest.MonkeyPatch()
    mp.chdir(cache)  # the workers start in the driver's working directory
    # Ray's workers inherit the environment the instance starts with
    mp.setenv("PYTHONPATH", os.pathsep.join([str(SCRIPTS), os.environ.get("PYTHONPATH", "")]))
    mp.setenv("SSS_CACHE", str(cache))
    # Ray's controller collects each report (and sees a dead worker) at this interval, 2 s by default: a report
    # waits for the one before to be collected, and these runs report every 2 steps
    mp.setenv("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.2")
    mp.setenv("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")  # two processes fewer to start on 2 cores
    mp.setenv("RAY_TRAIN_METRICS_ENABLED", "0")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield cache
    ray.shutdown()
    mp.undo()


@pytest.fixture(scope="module")
def straight(ray_instance, tmp_path_factory):
    """An uninterrupted run in 2 Ray workers, through `sss fit --engine ray --num-workers 2`."""
    out = tmp_path_factory.mktemp("straight") / "run"
    with pytest.MonkeyPatch.context() as mp:
        import accelerate.commands.config

        mp.chdir(out.parent)
        mp.setenv("SSS_CACHE", str(ray_instance))
        mp.setattr(accelerate.commands.config, "default_config_file", str(out.parent / "no_accelerate_config.yaml"))
        code = main(["fit", EXAMPLE, *SHORT, f"trainer.output_dir={out}", "--engine", "ray", "--num-workers", "2"])
    assert code == 0
    return out


@pytest.mark.slow
def test_ray_workers_train_the_weights_of_two_accelerate_processes(straight, ray_instance, monkeypatch):
    results = json.loads((straight / "results.json").read_text())
    assert results["num_processes"] == 2 and results["global_step"] == 12 and results["resumed_from"] is None
    assert (straight / "ray").is_dir()  # Ray's own records (RunConfig.storage_path), beside the sss run
    monkeypatch.setenv("SSS_CACHE", str(ray_instance))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # what Ray gives a worker of 1 CPU, and torchrun its processes
    assert main(["fit", EXAMPLE, *SHORT, "trainer.output_dir=accelerate", "--num-processes", "2"]) == 0
    launched = json.loads(Path("accelerate/results.json").read_text())
    assert launched["num_processes"] == 2 and launched["global_step"] == 12
    assert _equal(_weights(straight), _weights(Path("accelerate"))), "Ray's weights differ from accelerate launch's"


@pytest.mark.slow
def test_a_killed_worker_is_replaced_and_the_run_continues_from_its_checkpoint(straight, ray_instance, tmp_path):
    from sss.run.ray_train import fit_with_ray

    out = tmp_path / "killed"
    cfg = load_config(
        EXAMPLE, [*SHORT, f"trainer.output_dir={out}", "callbacks=[{_target_: ray_kill.KillPoint, at: 5, rank: 1}]"]
    )
    killed: list[int] = []

    def kill_the_worker() -> None:  # rank 1 waits after step 5; the newest checkpoint then is step 3 (epoch 1)
        deadline = time.monotonic() + 120
        while not (out / "kill_me.pid").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)  # the file is written before the pid is: let it be complete
        pid = int((out / "kill_me.pid").read_text())
        os.kill(pid, signal.SIGKILL)
        killed.append(pid)

    killer = threading.Thread(target=kill_the_worker, daemon=True)
    killer.start()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SSS_CACHE", str(ray_instance))
        results = fit_with_ray(cfg, num_workers=2, max_failures=1)
    killer.join(timeout=5)
    assert killed and not Path(f"/proc/{killed[0]}").exists()
    assert results["resumed_from"] == str(out / "checkpoints" / "step_0000003")
    assert results["global_step"] == 12 and results["num_processes"] == 2
    assert _equal(_weights(out), _weights(straight)), "the continued run's weights differ from the straight run's"


def test_ray_flags_and_a_missing_ray_are_one_line_errors(capsys, monkeypatch):
    boring = "model: {_target_: sss.testing.BoringModule}\ndata: {_target_: sss.testing.BoringDataModule}\n"
    Path("run.yaml").write_text(boring)
    cases = {
        ("--engine", "ray", "--num-processes", "2"): "error: --engine ray starts its own worker processes: give "
        "--num-workers N instead of --num-processes 2 (or leave --engine ray off to launch through Accelerate)",
        ("--engine", "ray"): "error: --engine ray needs --num-workers N",
        ("--num-workers", "2"): "error: --num-workers: only with --engine ray",
        ("--max-failures", "0"): "error: --max-failures: only with --engine ray",
        ("--engine", "ray", "--num-workers", "0"): "error: --num-workers must be >= 1, got 0",
        ("--engine", "ray", "--num-workers", "2", "--resume", "runs/x/checkpoints/step_0000004"): "error: sss fit "
        "--engine ray --resume runs/x/checkpoints/step_0000004: a Ray run continues from the newest checkpoint",
    }
    for flags, message in cases.items():
        code = main(["fit", "run.yaml", *flags])
        err = capsys.readouterr().err
        assert code != 0 and err.startswith(message) and err.count("\n") == 1, (flags, err)
    monkeypatch.setitem(sys.modules, "ray", None)  # what `import ray` meets where Ray is not installed
    monkeypatch.setitem(sys.modules, "ray.train.torch", None)
    assert main(["fit", "run.yaml", "--engine", "ray", "--num-workers", "2"]) == 1
    assert capsys.readouterr().err == "error: sss fit --engine ray needs Ray: pip install 'shadow-sound-hunter[ray]'\n"
    assert not Path("runs").exists()  # refused before anything was written


def _closed_port() -> int:
    import socket

    with socket.socket() as s:  # free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_ray_address_where_nothing_listens_fails_in_seconds_in_one_line(capsys, monkeypatch):
    import ray

    # ray.init would wait there for minutes; the module's local instance may be up, but this run starts its own
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    Path("run.yaml").write_text(
        "model: {_target_: sss.testing.BoringModule}\ndata: {_target_: sss.testing.BoringDataModule}\n"
    )
    port, started = _closed_port(), time.monotonic()
    assert main(["fit", "run.yaml", "--engine", "ray", "--num-workers", "1", "--ray-address", f"127.0.0.1:{port}"]) == 1
    assert capsys.readouterr().err == (
        f"error: --ray-address 127.0.0.1:{port}: no Ray cluster answered at 127.0.0.1:{port} (connection refused; "
        f"a 5 s check). Start one there (`ray start --head --port {port}`), or give the address `ray start` "
        "printed, or drop --ray-address for a local Ray instance\n"
    )
    monkeypatch.setenv("RAY_ADDRESS", f"ray://user:password@127.0.0.1:{port}")  # Ray's own variable, a password in it
    assert main(["fit", "run.yaml", "--engine", "ray", "--num-workers", "1"]) == 1
    err = capsys.readouterr().err
    assert (
        err.startswith(f"error: RAY_ADDRESS ray://user:***@127.0.0.1:{port}: no Ray cluster answered")
        and "--ray-client" in err
    )
    assert time.monotonic() - started < 60 and not Path("runs").exists()


@pytest.mark.slow
def test_an_undecodable_wav_stops_the_ray_run_at_once_with_its_line_despite_max_failures(
    ray_instance, capsys, tmp_path
):
    import numpy as np
    import soundfile as sf

    root = tmp_path / "ds"
    root.mkdir()
    rows = ["audio,label"]
    for i in range(6):
        sf.write(root / f"a{i}.wav", 0.3 * np.sin(np.arange(8000) * (0.1 + i / 50)), 16000, subtype="PCM_16")
        rows.append(f"a{i}.wav,{'ab'[i % 2]}")
    (root / "bad.wav").write_bytes(np.random.default_rng(0).bytes(3000))
    rows.insert(3, "bad.wav,a")
    (root / "train.csv").write_text("\n".join(rows) + "\n")
    overrides = [f"data.root={root}", "model.name=hunter_tiny", "data.num_workers=0", "data.batch_size=2"]
    overrides += [
        "data.clip_seconds=0.5",
        "trainer.max_steps=8",
        "trainer.log.trackers=[csv]",
        "trainer.log.progress=false",
    ]
    overrides += ["trainer.log.plots=false", "trainer.mixed_precision=no"]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SSS_CACHE", str(ray_instance))
        assert main(["fit", MANIFEST, *overrides, f"trainer.output_dir={tmp_path / 'one'}"]) == 1
        alone = capsys.readouterr().err  # the 1-process run's line
        assert alone.startswith(f"error: {root / 'train.csv'}, line 4: audio file") and alone.count("\n") == 1
        codes: list[int] = []
        flags = ["--engine", "ray", "--num-workers", "1", "--max-failures", "-1"]
        run = threading.Thread(
            target=lambda: codes.append(
                main(["fit", MANIFEST, *overrides, f"trainer.output_dir={tmp_path / 'ray'}", *flags])
            ),
            daemon=True,
        )
        run.start()
        run.join(timeout=300)  # restarted forever without the fix: Ray's instance ends with the module
    assert codes == [1], "the Ray run was still restarting after 300 s"
    assert capsys.readouterr().err == alone  # that line, once, and its exit code


@pytest.mark.slow
def test_ray_workers_read_their_share_of_tar_shards_as_two_accelerate_processes_do(ray_instance, monkeypatch):
    import accelerate.commands.config

    from sss.data.shards import pack
    from sss.data.synthetic import make_industrial

    monkeypatch.chdir(ray_instance)  # the workers start in the driver's working directory
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setattr(accelerate.commands.config, "default_config_file", str(ray_instance / "no_accelerate.yaml"))
    src = make_industrial(Path("ind-src"), n_train=40, n_val=8, n_test=0)
    pack(src, "ind-shards", shard_size=6)  # 7 shards (the last of 4) for 2 processes x 2 workers
    run = [
        "model.name=hunter_tiny",
        f"data.root={Path('ind-shards').resolve()}",
        "data.layout=shards",
        "data.batch_size=4",
        "trainer.max_epochs=2",
        "trainer.log.progress=false",
        "trainer.log.plots=false",
    ]
    assert main(["fit", MANIFEST, *run, "trainer.output_dir=ray-shards", "--engine", "ray", "--num-workers", "2"]) == 0
    assert main(["fit", MANIFEST, *run, "trainer.output_dir=acc-shards", "--num-processes", "2"]) == 0
    ray_run, launched = (json.loads(Path(f"{d}/results.json").read_text()) for d in ("ray-shards", "acc-shards"))
    assert ray_run["global_step"] == launched["global_step"] == 12  # 10 samples a reader: 6 batches a process, epoch
    assert _equal(_weights(Path("ray-shards")), _weights(Path("acc-shards"))), "Ray's weights differ"

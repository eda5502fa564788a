"""Typed configuration: YAML + flags, type checks and errors that name the setting."""

from dataclasses import dataclass
from typing import Literal

import pytest

from rollway.common.config import ConfigError, from_dict, parse, parse_components, setting


@dataclass
class Optim:
    """Optimizer settings."""

    lr: float = setting(1e-6, "learning rate")
    lr_warmup_iters: int = setting(0, "warm-up steps")
    lr_decay_style: Literal["constant", "linear", "cosine"] = setting("constant", "schedule")
    use_kl_loss: bool = setting(False, "KL as a loss term")
    kl_coef: float = setting(0.0, "KL reward penalty")
    prompt_data: list[str] = setting([], "name path pairs")
    ref_load: str | None = setting(None, "reference checkpoint")

    def validate(self) -> None:
        if self.use_kl_loss and self.kl_coef:
            raise ConfigError("kl_coef", "cannot be combined with use_kl_loss")


@dataclass
class Server:
    """Server settings."""

    port: int = setting(0, "port")


def test_yaml_then_flags_flags_win(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("lr: 1.0e-5\nlr-warmup-iters: 10\nprompt_data: [a, a.parquet]\n")
    config = parse(Optim, ["--config", str(path), "--lr", "3e-4", "--lr-decay-style", "cosine"])
    assert config.lr == 3e-4
    assert config.lr_warmup_iters == 10
    assert config.lr_decay_style == "cosine"
    assert config.prompt_data == ["a", "a.parquet"]
    assert config.ref_load is None


def test_bool_flags_and_lists():
    config = parse(Optim, ["--use-kl-loss", "--prompt-data", "x", "x.jsonl", "y", "y.jsonl"])
    assert config.use_kl_loss is True
    assert config.prompt_data == ["x", "x.jsonl", "y", "y.jsonl"]
    assert parse(Optim, ["--no-use-kl-loss"]).use_kl_loss is False


@pytest.mark.parametrize(
    ("data", "setting_name", "fragment"),
    [
        ({"lr": "fast"}, "lr", "must be a number"),
        ({"lr_warmup_iters": 1.5}, "lr_warmup_iters", "must be an integer"),
        ({"lr_decay_style": "step"}, "lr_decay_style", "must be one of constant, linear, cosine"),
        ({"use_kl_loss": "maybe"}, "use_kl_loss", "true or false"),
        ({"lr_warmup_iter": 3}, "lr_warmup_iter", "did you mean lr_warmup_iters"),
        ({"use_kl_loss": True, "kl_coef": 0.1}, "kl_coef", "cannot be combined"),
    ],
)
def test_errors_name_the_setting(data, setting_name, fragment):
    with pytest.raises(ConfigError) as err:
        from_dict(Optim, data)
    assert err.value.setting == setting_name
    assert fragment in str(err.value)
    assert str(err.value).startswith(f"{setting_name}:")


def test_parse_exits_with_the_setting_named(capsys):
    with pytest.raises(SystemExit) as exit_:
        parse(Optim, ["--lr", "fast"])
    assert exit_.value.code == 2
    assert "lr: must be a number (got 'fast')" in capsys.readouterr().err


def test_missing_yaml_file_is_named(tmp_path):
    with pytest.raises(SystemExit):
        parse(Optim, ["--config", str(tmp_path / "nope.yaml")])


def test_components_share_one_flat_namespace(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("port: 7000\nlr: 0.5\n")
    server, optim = parse_components([Server, Optim], ["--config", str(path), "--port", "7001"])
    assert server.port == 7001 and optim.lr == 0.5
    with pytest.raises(SystemExit):
        parse_components([Server, Optim], ["--config", str(path), "--portt", "1"])
    path.write_text("prot: 7000\n")
    with pytest.raises(SystemExit):
        parse_components([Server, Optim], ["--config", str(path)])


@dataclass
class Rollout:
    """Rollout settings sharing a name with Optim."""

    lr: float = setting(1e-6, "same setting, same type and default")
    async_mode: bool = setting(False, "Miles' --async", aliases=("async",))


@dataclass
class Clash:
    """Declares lr differently."""

    lr: int = setting(3, "clashes")


def test_shared_settings_reach_every_component_and_aliases_work(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("async: true\n")
    optim, rollout = parse_components([Optim, Rollout], ["--config", str(path), "--lr", "0.25"])
    assert optim.lr == rollout.lr == 0.25
    assert rollout.async_mode is True
    (rollout,) = parse_components([Rollout], ["--async"])
    assert rollout.async_mode is True
    with pytest.raises(TypeError, match="lr has different defaults"):
        parse_components([Optim, Clash], [])


def test_settings_several_components_read_are_declared_once_in_shared_settings():
    """One flat run config reaches every component: a key two of them declare must mean the same
    (one default, one doc), so it is declared once in rollway.common.shared_settings."""
    import dataclasses

    from rollway.common import shared_settings
    from rollway.coordinator.run_config import COMPONENTS

    declared: dict[str, list] = {}
    for cls in COMPONENTS.values():
        for f in dataclasses.fields(cls):
            declared.setdefault(f.name, []).append(f)
    shared = {name: fields for name, fields in declared.items() if len(fields) > 1}
    assert {"hf_checkpoint", "rollout_temperature", "advantage_estimator"} <= set(shared)
    for name, fields in shared.items():
        assert all(f.metadata["shared"] for f in fields), f"{name} is declared by several components"
        assert hasattr(shared_settings, name)
        assert len({f.metadata["doc"] for f in fields}) == 1, name
        defaults = [
            f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default for f in fields
        ]
        assert all(d == defaults[0] for d in defaults), name

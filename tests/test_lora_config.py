"""LoRA configuration: --lora-modules in vLLM's two forms, the runtime switch, render's aliases."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from render.errors import ModelNotFoundError
from render.models import EMBEDDED_MODEL
from render.service.config import model_spec, parse_args
from render.service.loading import load_models
from render.service.lora_modules import LoRAModule, lora_modules, parse_lora_module
from router.config import (
    RUNTIME_LORA_ENV,
    ConfigError,
    add_arguments,
    from_args,
    from_mapping,
    load_file,
)

TEXT = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=30)


def _router_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


@given(name=TEXT.filter(lambda s: "=" not in s and "," not in s),
       path=TEXT.filter(lambda s: "," not in s))
def test_name_equals_path_form(name: str, path: str) -> None:
    assert parse_lora_module(f"{name}={path}") == LoRAModule(name, path)


@given(name=TEXT, path=TEXT, base=st.none() | TEXT, is_3d=st.booleans())
def test_json_form_round_trips(name: str, path: str, base: str | None, is_3d: bool) -> None:
    item = json.dumps({"name": name, "path": path, "base_model_name": base,
                       "is_3d_lora_weight": is_3d})
    assert parse_lora_module(item) == LoRAModule(name, path, base, is_3d)


@pytest.mark.parametrize(("item", "message"), [
    ("{not json", "Invalid JSON format for --lora-modules"),
    ('{"name": "a"}', "name and path are required"),
    ('{"name": "a", "path": "/p", "rank": 8}', "unknown rank"),
    ('["a", "/p"]', "expected an object"),
    ("=/p", "non-empty name"),
    ("a=", "non-empty path"),
    ('{"name": "a", "path": "/p", "is_3d_lora_weight": "yes"}', "must be a boolean"),
])
def test_bad_modules_are_refused(item: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_lora_module(item)


def test_router_flags_env_switch_and_config_file(tmp_path: Path) -> None:
    args = _router_args("--lora-modules", "a=/adapters/a",
                        '{"name": "b", "path": "/adapters/b", "base_model_name": "m"}',
                        "--lora-modules", "c=/adapters/c")
    cfg = from_args(args, {})
    assert cfg.lora_modules == (LoRAModule("a", "/adapters/a"),
                                LoRAModule("b", "/adapters/b", "m"), LoRAModule("c", "/adapters/c"))
    assert cfg.allow_runtime_lora_updating is False
    # vLLM's reading of its switch: "1" or "true" in any case, nothing else.
    for value, on in (("1", True), (" True ", True), ("0", False), ("yes", False)):
        assert from_args(args, {RUNTIME_LORA_ENV: value}).allow_runtime_lora_updating is on
    # The config file's modules come first, the flags' are added after them.
    file = tmp_path / "router.toml"
    file.write_text('allow_runtime_lora_updating = true\n'
                    'lora_modules = ["x=/adapters/x", {name = "y", path = "/adapters/y"}]\n')
    cfg = from_args(_router_args("--config", str(file), "--lora-modules", "z=/adapters/z"), {})
    assert [m.name for m in cfg.lora_modules] == ["x", "y", "z"]
    assert cfg.allow_runtime_lora_updating is True
    assert from_mapping(load_file(str(file))).lora_modules[1] == LoRAModule("y", "/adapters/y")


@pytest.mark.parametrize(("data", "message"), [
    ({"lora_modules": ["a=/x", "a=/y"]}, "a given twice"),
    ({"lora_modules": "a=/x"}, "expected a list"),
    ({"lora_modules": [{"name": "a"}]}, "name and path are required"),
    ({"allow_runtime_lora_updating": "1"}, "allow_runtime_lora_updating must be bool"),
])
def test_router_config_errors_name_the_key(data: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        from_mapping(data)


def test_render_service_aliases_adapters_to_their_base_model() -> None:
    cfg = parse_args(["--lora-modules", "sql=/adapters/sql",
                      '{"name": "chat", "path": "/adapters/chat", "base_model_name": "other"}'])
    assert cfg.lora_modules == (LoRAModule("sql", "/adapters/sql"),
                                LoRAModule("chat", "/adapters/chat", "other"))
    registry = load_models([model_spec(EMBEDDED_MODEL)], lora_modules=cfg.lora_modules)
    base = registry.get(None)
    # An adapter renders with its base model (a base_model_name that is not served: the first).
    assert registry.get("sql") is base and registry.get("chat") is base
    assert registry.names() == [base.served_model_name]
    assert registry.aliases() == {"sql": base.served_model_name, "chat": base.served_model_name}
    registry.remove_alias("sql")
    with pytest.raises(ModelNotFoundError):
        registry.get("sql")
    with pytest.raises(ValueError, match="served model's name"):
        registry.add_alias(base.served_model_name, None)


def test_render_service_refuses_an_adapter_named_like_a_model(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(["--served-model-name", "m", "--lora-modules", "m=/adapters/m"])
    assert "conflicts with a served base model" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_args(["--lora-modules", "a=/x", "a=/y"])
    assert "a given twice" in capsys.readouterr().err


def test_lora_modules_accepts_tables_and_strings() -> None:
    got = lora_modules(["a=/x", {"name": "b", "path": "/y", "is_3d_lora_weight": True}])
    assert got == (LoRAModule("a", "/x"), LoRAModule("b", "/y", None, True))

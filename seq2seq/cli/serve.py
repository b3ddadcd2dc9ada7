"""``python serve.py checkpoint=PATH [overrides]`` / ``seq2seq-serve``: the translation API.

Loads the configured checkpoints or exported folders (``checkpoint=PATH`` or ``models={name:
path, ...}``), builds the app of :mod:`seq2seq.serving.app` and runs it with uvicorn on
``host:port``; the options are ``seq2seq/configs/serve.yaml``'s, the API and its LibreTranslate
routes docs/serving.md's. SIGTERM (or Ctrl-C) lets the requests in flight and the batchers'
queues finish, exit status 0; a bad option, checkpoint, glossary or port: one ``error: ...``
line, exit status 1.
"""

from __future__ import annotations

import logging
import signal
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from seq2seq.cli.app import hydra_tool
from seq2seq.cli.common import checkpoint_paths, fail, require_checkpoint_files
from seq2seq.cli.decoding_request import check_config, start_decoding

log = logging.getLogger("seq2seq.serve")


def model_paths(cfg: DictConfig) -> dict[str, str | list[str]]:
    """name -> checkpoint path (a list: an ensemble), from ``checkpoint`` (+ ``name``) or
    ``models``."""
    models = OmegaConf.to_container(cfg.models, resolve=True) if cfg.get("models") else {}
    if cfg.checkpoint and models:
        fail("give either checkpoint=PATH or models={name: path, ...}, not both")
    if cfg.checkpoint:
        paths = checkpoint_paths(cfg.checkpoint)
        path = Path(paths[0])
        name = cfg.get("name") or (
            path.parents[1].name if path.parent.name == "checkpoints" and path.parents[1].name
            else path.stem
        )
        if len(paths) > 1 and not cfg.get("name"):
            name = "ensemble"
        return {str(name): paths if len(paths) > 1 else paths[0]}
    if not models:
        fail("no model given: add checkpoint=PATH or 'models={name: path, ...}'")
    if not isinstance(models, dict):
        fail("models must be a mapping {name: checkpoint path, ...}")
    return {
        str(name): checkpoint_paths(path) if isinstance(path, list) else str(path)
        for name, path in models.items()
    }


def configured_languages(cfg: DictConfig) -> tuple[str, str] | None:
    """``src_lang`` and ``tgt_lang``, for the models whose checkpoint records no languages."""
    pair = (cfg.get("src_lang"), cfg.get("tgt_lang"))
    if pair == (None, None):
        return None
    if None in pair:
        fail("give both src_lang and tgt_lang, or neither")
    if "auto" in pair:
        fail("'auto' is no language code: LibreTranslate's clients ask the server to detect with it")
    return str(pair[0]), str(pair[1])


def build_app(cfg: DictConfig):
    """The app serving the configured models (exits with a one-line error on a problem)."""
    check_config(cfg)
    paths = model_paths(cfg)  # its errors too come before torch's import
    configured = configured_languages(cfg)
    for name, path in paths.items():
        require_checkpoint_files(path if isinstance(path, list) else [path],
                                 prefix=f"model {name}: ")
    try:
        from seq2seq.serving.app import create_app
        from seq2seq.serving.models import load_model
    except ImportError as error:
        fail(f"serving needs FastAPI and uvicorn ({error.name} is missing): pip install '.[serve]'")
    from seq2seq.checkpoint import CheckpointError

    request = start_decoding(cfg)
    served = {}
    languages = {}
    for name, path in paths.items():
        try:
            served[name] = load_model(path, device=cfg.device, options=request.options,
                                      **request.translator_settings)
        except (CheckpointError, ValueError) as error:
            fail(f"model {name}: {error}")
        log.info("model %s: %s (%s, %d parameters) on %s", name, path, served[name].scorer,
                 served[name].parameters, served[name].translator.device)
        pair = served[name].languages or configured
        if pair is not None:
            languages[name] = pair
            log.info("model %s: LibreTranslate's /translate serves %s -> %s", name, *pair)
        if cfg.get("shortlist"):
            log.info("model %s: output vocabulary restricted by shortlist %s", name, cfg.shortlist)
        try:  # each model must be able to write every target term
            request.check(served[name].translator)
        except ValueError as error:
            fail(f"model {name}: {error}")
    glossary = request.glossary
    if glossary is not None:
        log.info("terms: %d entries of %s applied to every request", len(glossary), cfg.terms)
    try:
        return create_app(
            served,
            max_lines=cfg.limits.max_lines,
            max_chars=cfg.limits.max_chars,
            max_beam_size=cfg.limits.max_beam_size,
            window_ms=cfg.batching.window_ms,
            batch_tokens=cfg.batching.max_tokens,
            terms=glossary,
            languages=languages,
        )
    except ValueError as error:
        fail(error)


def _after_shutdown(signum: int, frame) -> None:
    log.info("stopped by %s", signal.Signals(signum).name)


def run(cfg: DictConfig) -> None:
    """Serve until SIGTERM / Ctrl-C."""
    app = build_app(cfg)
    import uvicorn

    config = uvicorn.Config(
        app, host=cfg.host, port=int(cfg.port), log_level=cfg.log_level,
        access_log=bool(cfg.access_log), log_config=None, timeout_graceful_shutdown=60,
    )
    server = uvicorn.Server(config)
    log.info("serving on http://%s:%d/", cfg.host, int(cfg.port))
    # Uvicorn handles SIGTERM/SIGINT itself (graceful shutdown), then restores the handlers it
    # found and raises the signal again: with these, that second delivery ends in exit status 0.
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _after_shutdown)
    server.run()
    if not server.started:  # e.g. the port is in use (uvicorn has logged why)
        fail(f"could not serve on {cfg.host}:{cfg.port}")


# ``python serve.py``: see the module docstring (``--help`` lists the options).
main = hydra_tool(run, config_name="serve", summary=__doc__.splitlines()[0])


if __name__ == "__main__":
    main()

"""`python -m seq2seq.cli.prepare_data` (`make data`): prepare and cache the data, print a summary.

Any Hydra override of train.yaml's data/tokenizer/paths groups works the same here, e.g.
`python -m seq2seq.cli.prepare_data data.src_lang=en data.tgt_lang=fr tokenizer=unigram`.
"""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from seq2seq.cli.app import hydra_tool
from seq2seq.cli.common import fail
from seq2seq.data.prepare import prepare_from_config
from seq2seq.data.text_files import DataError


def run(cfg: DictConfig) -> None:
    """Prepares the configured data and prints its summary; exits with 1 on a DataError."""
    try:
        prepared = prepare_from_config(OmegaConf.to_container(cfg, resolve=True),
                                       progress=cfg.get("progress"))
    except DataError as error:
        fail(str(error))  # the whole message (fail(error) keeps the first line only)
    print(prepared.format_summary(), flush=True)


# ``python prepare_data.py``: see the module docstring (``--help`` lists the options).
main = hydra_tool(run, config_name="prepare_data", summary=__doc__.splitlines()[0],
                  strict=False)


if __name__ == "__main__":
    main()

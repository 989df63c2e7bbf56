"""Router-side view of the replicas' prefix caches, learned from vLLM's KV cache events.

* :mod:`.hashing`: token ids -> vLLM's block hashes (the scheme of
  ``vllm/v1/core/kv_cache_utils.py``) with :class:`BlockHasher`;
* :mod:`.tokenize`: an OpenAI request body -> the servers' token ids (Hugging Face tokenizer);
* :mod:`.events`: vLLM's ``KVEventBatch`` msgpack wire format (``vllm/distributed/kv_events.py``),
  decoding and encoding;
* :mod:`.index`: :class:`KvIndex`, per replica the set of cached block hashes, fed by decoded
  event batches, with sequence-gap detection; :class:`PrefixCacheView` is what a policy asks
  ("how many leading blocks of these hashes does worker W hold").

Sans-I/O: the ZMQ subscribers that feed the index live in ``serve``.
"""

from sessionroute.router.kv.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    decode_batch,
    encode_batch,
)
from sessionroute.router.kv.hashing import HASH_ALGOS, BlockHasher, block_hashes, none_hash
from sessionroute.router.kv.index import KvIndex, PrefixCacheView

__all__ = [
    "HASH_ALGOS",
    "AllBlocksCleared",
    "BlockHasher",
    "BlockRemoved",
    "BlockStored",
    "KVEventBatch",
    "KvIndex",
    "PrefixCacheView",
    "block_hashes",
    "decode_batch",
    "encode_batch",
    "none_hash",
]

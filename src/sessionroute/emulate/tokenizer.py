"""The emulator's tokenizer, chat template and generated text.

The implementation lives in :mod:`sessionroute.router.kv.wordtokens` (a layer below both the
emulator and the router), so that ``serve --kv-tokenizer emulator`` computes from a request body
the same token ids, hence the same vLLM block hashes, as the emulator it routes to.
"""

from sessionroute.router.kv.wordtokens import (
    FILLER_WORDS,
    ChatEncoder,
    HashTokenizer,
    filler_pieces,
    render_chat,
)

__all__ = ["FILLER_WORDS", "ChatEncoder", "HashTokenizer", "filler_pieces", "render_chat"]

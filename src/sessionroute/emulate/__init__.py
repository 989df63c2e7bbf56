"""An emulated vLLM replica: an OpenAI-compatible server backed by the replica model in real time.

``sessionroute emulate`` (``docs/emulator.md``) or, in-process::

    async with emulators(3, EmulatorSettings(port=0, time_scale=10)) as handles:
        urls = [h.url for h in handles]   # OpenAI base URL: url + "/v1"
"""

from sessionroute.emulate.app import EMULATOR_KEY, build_app
from sessionroute.emulate.driver import RealTimeEngine, Ticket, tokens_generated
from sessionroute.emulate.metrics import EmulatorMetrics
from sessionroute.emulate.protocol import EmulatorRequestError
from sessionroute.emulate.server import (
    EmulatorHandle,
    emulators,
    run,
    serve,
    start_emulator,
    start_emulators,
    stop_all,
)
from sessionroute.emulate.service import EmulatedReplica, Generation, output_seed
from sessionroute.emulate.settings import DEFAULT_PROFILE, EmulatorSettings
from sessionroute.emulate.tokenizer import (
    FILLER_WORDS,
    ChatEncoder,
    HashTokenizer,
    filler_pieces,
    render_chat,
)

__all__ = [
    "DEFAULT_PROFILE",
    "EMULATOR_KEY",
    "FILLER_WORDS",
    "ChatEncoder",
    "EmulatedReplica",
    "EmulatorHandle",
    "EmulatorMetrics",
    "EmulatorRequestError",
    "EmulatorSettings",
    "Generation",
    "HashTokenizer",
    "RealTimeEngine",
    "Ticket",
    "build_app",
    "emulators",
    "filler_pieces",
    "output_seed",
    "render_chat",
    "run",
    "serve",
    "start_emulator",
    "start_emulators",
    "stop_all",
    "tokens_generated",
]

"""A pure model of one vLLM V1 replica: prefix-cached KV blocks, scheduler and step time.

See ``docs/engine.md`` and ``shared/ENGINE.md``. Everything is synchronous; time comes only from
the arguments (:meth:`Replica.add_request`, :meth:`Replica.advance`).
"""

from sessionroute.replica.api import (
    EngineRequest,
    EngineRequestError,
    ReplicaConfig,
    ReplicaCounters,
    RequestResult,
    chain_block_keys,
    key_list,
)
from sessionroute.replica.profiles import (
    PROFILES,
    ProfileFile,
    StepTimeProfile,
    is_profile_path,
    load_profile_file,
    load_profiles,
)
from sessionroute.replica.replica import Replica

__all__ = [
    "PROFILES",
    "EngineRequest",
    "EngineRequestError",
    "ProfileFile",
    "Replica",
    "ReplicaConfig",
    "ReplicaCounters",
    "RequestResult",
    "StepTimeProfile",
    "chain_block_keys",
    "is_profile_path",
    "key_list",
    "load_profile_file",
    "load_profiles",
]

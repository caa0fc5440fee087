from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class MetadataValue(_message.Message):
    __slots__ = ("string_value", "float_value", "int_value")
    STRING_VALUE_FIELD_NUMBER: _ClassVar[int]
    FLOAT_VALUE_FIELD_NUMBER: _ClassVar[int]
    INT_VALUE_FIELD_NUMBER: _ClassVar[int]
    string_value: str
    float_value: float
    int_value: int
    def __init__(self, string_value: _Optional[str] = ..., float_value: _Optional[float] = ..., int_value: _Optional[int] = ...) -> None: ...

class Trajectory(_message.Message):
    __slots__ = ("uid", "prompt_id", "group_id", "env", "tokens", "action_mask", "rollout_logprobs", "policy_versions", "reward", "metadata")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: MetadataValue
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[MetadataValue, _Mapping]] = ...) -> None: ...
    UID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    ACTION_MASK_FIELD_NUMBER: _ClassVar[int]
    ROLLOUT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    uid: str
    prompt_id: str
    group_id: str
    env: str
    tokens: bytes
    action_mask: bytes
    rollout_logprobs: bytes
    policy_versions: bytes
    reward: float
    metadata: _containers.MessageMap[str, MetadataValue]
    def __init__(self, uid: _Optional[str] = ..., prompt_id: _Optional[str] = ..., group_id: _Optional[str] = ..., env: _Optional[str] = ..., tokens: _Optional[bytes] = ..., action_mask: _Optional[bytes] = ..., rollout_logprobs: _Optional[bytes] = ..., policy_versions: _Optional[bytes] = ..., reward: _Optional[float] = ..., metadata: _Optional[_Mapping[str, MetadataValue]] = ...) -> None: ...

class Rejection(_message.Message):
    __slots__ = ("index", "uid", "reason")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    index: int
    uid: str
    reason: str
    def __init__(self, index: _Optional[int] = ..., uid: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class PushSummary(_message.Message):
    __slots__ = ("accepted", "rejected", "rejections", "version")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    REJECTED_FIELD_NUMBER: _ClassVar[int]
    REJECTIONS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    accepted: int
    rejected: int
    rejections: _containers.RepeatedCompositeFieldContainer[Rejection]
    version: int
    def __init__(self, accepted: _Optional[int] = ..., rejected: _Optional[int] = ..., rejections: _Optional[_Iterable[_Union[Rejection, _Mapping]]] = ..., version: _Optional[int] = ...) -> None: ...

class StatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StatsReply(_message.Message):
    __slots__ = ("accepted", "rejected", "duplicates", "dropped_stale", "queued", "consumed", "version", "capacity", "put_timeouts", "lag_histogram", "age_mean_s", "age_p50_s", "age_p90_s", "age_max_s", "put_wait_s", "get_wait_s", "unauthenticated")
    class RejectedEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class LagHistogramEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: int
        def __init__(self, key: _Optional[int] = ..., value: _Optional[int] = ...) -> None: ...
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    REJECTED_FIELD_NUMBER: _ClassVar[int]
    DUPLICATES_FIELD_NUMBER: _ClassVar[int]
    DROPPED_STALE_FIELD_NUMBER: _ClassVar[int]
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    CONSUMED_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    PUT_TIMEOUTS_FIELD_NUMBER: _ClassVar[int]
    LAG_HISTOGRAM_FIELD_NUMBER: _ClassVar[int]
    AGE_MEAN_S_FIELD_NUMBER: _ClassVar[int]
    AGE_P50_S_FIELD_NUMBER: _ClassVar[int]
    AGE_P90_S_FIELD_NUMBER: _ClassVar[int]
    AGE_MAX_S_FIELD_NUMBER: _ClassVar[int]
    PUT_WAIT_S_FIELD_NUMBER: _ClassVar[int]
    GET_WAIT_S_FIELD_NUMBER: _ClassVar[int]
    UNAUTHENTICATED_FIELD_NUMBER: _ClassVar[int]
    accepted: int
    rejected: _containers.ScalarMap[str, int]
    duplicates: int
    dropped_stale: int
    queued: int
    consumed: int
    version: int
    capacity: int
    put_timeouts: int
    lag_histogram: _containers.ScalarMap[int, int]
    age_mean_s: float
    age_p50_s: float
    age_p90_s: float
    age_max_s: float
    put_wait_s: float
    get_wait_s: float
    unauthenticated: int
    def __init__(self, accepted: _Optional[int] = ..., rejected: _Optional[_Mapping[str, int]] = ..., duplicates: _Optional[int] = ..., dropped_stale: _Optional[int] = ..., queued: _Optional[int] = ..., consumed: _Optional[int] = ..., version: _Optional[int] = ..., capacity: _Optional[int] = ..., put_timeouts: _Optional[int] = ..., lag_histogram: _Optional[_Mapping[int, int]] = ..., age_mean_s: _Optional[float] = ..., age_p50_s: _Optional[float] = ..., age_p90_s: _Optional[float] = ..., age_max_s: _Optional[float] = ..., put_wait_s: _Optional[float] = ..., get_wait_s: _Optional[float] = ..., unauthenticated: _Optional[int] = ...) -> None: ...

class HealthRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class HealthReply(_message.Message):
    __slots__ = ("serving", "version")
    SERVING_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    serving: bool
    version: int
    def __init__(self, serving: _Optional[bool] = ..., version: _Optional[int] = ...) -> None: ...

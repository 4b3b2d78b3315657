from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ErrorCode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ERROR_CODE_UNSPECIFIED: _ClassVar[ErrorCode]
    ERROR_CODE_MALFORMED_FRAME: _ClassVar[ErrorCode]
    ERROR_CODE_FRAME_TOO_LARGE: _ClassVar[ErrorCode]
    ERROR_CODE_UNEXPECTED_MESSAGE: _ClassVar[ErrorCode]
    ERROR_CODE_HELLO_REQUIRED: _ClassVar[ErrorCode]
    ERROR_CODE_HELLO_TIMEOUT: _ClassVar[ErrorCode]
    ERROR_CODE_UNSUPPORTED_VERSION: _ClassVar[ErrorCode]
    ERROR_CODE_KEEPALIVE_TIMEOUT: _ClassVar[ErrorCode]
    ERROR_CODE_SUPERSEDED: _ClassVar[ErrorCode]
    ERROR_CODE_INTERNAL: _ClassVar[ErrorCode]
    ERROR_CODE_UNKNOWN_COMMAND: _ClassVar[ErrorCode]
    ERROR_CODE_INVALID_ARGUMENT: _ClassVar[ErrorCode]
    ERROR_CODE_UNAUTHENTICATED: _ClassVar[ErrorCode]
    ERROR_CODE_SHUTTING_DOWN: _ClassVar[ErrorCode]

class ProviderStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PROVIDER_STATUS_UNSPECIFIED: _ClassVar[ProviderStatus]
    PROVIDER_STATUS_AVAILABLE: _ClassVar[ProviderStatus]
    PROVIDER_STATUS_DRAINED: _ClassVar[ProviderStatus]
    PROVIDER_STATUS_UNAVAILABLE: _ClassVar[ProviderStatus]

class ProviderHealth(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PROVIDER_HEALTH_UNSPECIFIED: _ClassVar[ProviderHealth]
    PROVIDER_HEALTH_HEALTHY: _ClassVar[ProviderHealth]
    PROVIDER_HEALTH_DEGRADED: _ClassVar[ProviderHealth]
    PROVIDER_HEALTH_UNHEALTHY: _ClassVar[ProviderHealth]
    PROVIDER_HEALTH_OFFLINE: _ClassVar[ProviderHealth]
    PROVIDER_HEALTH_UNKNOWN: _ClassVar[ProviderHealth]

class EngineState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ENGINE_STATE_UNSPECIFIED: _ClassVar[EngineState]
    ENGINE_STATE_STARTING: _ClassVar[EngineState]
    ENGINE_STATE_LOADING: _ClassVar[EngineState]
    ENGINE_STATE_READY: _ClassVar[EngineState]
    ENGINE_STATE_DRAINING: _ClassVar[EngineState]
    ENGINE_STATE_STOPPING: _ClassVar[EngineState]
    ENGINE_STATE_CRASHED: _ClassVar[EngineState]
    ENGINE_STATE_STOPPED: _ClassVar[EngineState]
    ENGINE_STATE_FAILED: _ClassVar[EngineState]

class CommandOutcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    COMMAND_OUTCOME_UNSPECIFIED: _ClassVar[CommandOutcome]
    COMMAND_OUTCOME_SUCCEEDED: _ClassVar[CommandOutcome]
    COMMAND_OUTCOME_FAILED: _ClassVar[CommandOutcome]
    COMMAND_OUTCOME_REJECTED: _ClassVar[CommandOutcome]

class ProviderAction(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PROVIDER_ACTION_UNSPECIFIED: _ClassVar[ProviderAction]
    PROVIDER_ACTION_RESTART: _ClassVar[ProviderAction]
    PROVIDER_ACTION_STOP: _ClassVar[ProviderAction]
    PROVIDER_ACTION_START: _ClassVar[ProviderAction]
    PROVIDER_ACTION_LOGS: _ClassVar[ProviderAction]

class InferenceEndpoint(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    INFERENCE_ENDPOINT_UNSPECIFIED: _ClassVar[InferenceEndpoint]
    INFERENCE_ENDPOINT_CHAT_COMPLETIONS: _ClassVar[InferenceEndpoint]
    INFERENCE_ENDPOINT_COMPLETIONS: _ClassVar[InferenceEndpoint]
    INFERENCE_ENDPOINT_EMBEDDINGS: _ClassVar[InferenceEndpoint]

class InferenceStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    INFERENCE_STATUS_UNSPECIFIED: _ClassVar[InferenceStatus]
    INFERENCE_STATUS_OK: _ClassVar[InferenceStatus]
    INFERENCE_STATUS_PROVIDER_ERROR: _ClassVar[InferenceStatus]
    INFERENCE_STATUS_CANCELLED: _ClassVar[InferenceStatus]
    INFERENCE_STATUS_REJECTED: _ClassVar[InferenceStatus]
    INFERENCE_STATUS_UNAVAILABLE: _ClassVar[InferenceStatus]

class InstanceState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    INSTANCE_STATE_UNSPECIFIED: _ClassVar[InstanceState]
    INSTANCE_STATE_PENDING: _ClassVar[InstanceState]
    INSTANCE_STATE_STARTING: _ClassVar[InstanceState]
    INSTANCE_STATE_READY: _ClassVar[InstanceState]
    INSTANCE_STATE_FAILED: _ClassVar[InstanceState]
    INSTANCE_STATE_REFUSED: _ClassVar[InstanceState]
    INSTANCE_STATE_STOPPING: _ClassVar[InstanceState]
    INSTANCE_STATE_STOPPED: _ClassVar[InstanceState]
    INSTANCE_STATE_DRIFTED: _ClassVar[InstanceState]
ERROR_CODE_UNSPECIFIED: ErrorCode
ERROR_CODE_MALFORMED_FRAME: ErrorCode
ERROR_CODE_FRAME_TOO_LARGE: ErrorCode
ERROR_CODE_UNEXPECTED_MESSAGE: ErrorCode
ERROR_CODE_HELLO_REQUIRED: ErrorCode
ERROR_CODE_HELLO_TIMEOUT: ErrorCode
ERROR_CODE_UNSUPPORTED_VERSION: ErrorCode
ERROR_CODE_KEEPALIVE_TIMEOUT: ErrorCode
ERROR_CODE_SUPERSEDED: ErrorCode
ERROR_CODE_INTERNAL: ErrorCode
ERROR_CODE_UNKNOWN_COMMAND: ErrorCode
ERROR_CODE_INVALID_ARGUMENT: ErrorCode
ERROR_CODE_UNAUTHENTICATED: ErrorCode
ERROR_CODE_SHUTTING_DOWN: ErrorCode
PROVIDER_STATUS_UNSPECIFIED: ProviderStatus
PROVIDER_STATUS_AVAILABLE: ProviderStatus
PROVIDER_STATUS_DRAINED: ProviderStatus
PROVIDER_STATUS_UNAVAILABLE: ProviderStatus
PROVIDER_HEALTH_UNSPECIFIED: ProviderHealth
PROVIDER_HEALTH_HEALTHY: ProviderHealth
PROVIDER_HEALTH_DEGRADED: ProviderHealth
PROVIDER_HEALTH_UNHEALTHY: ProviderHealth
PROVIDER_HEALTH_OFFLINE: ProviderHealth
PROVIDER_HEALTH_UNKNOWN: ProviderHealth
ENGINE_STATE_UNSPECIFIED: EngineState
ENGINE_STATE_STARTING: EngineState
ENGINE_STATE_LOADING: EngineState
ENGINE_STATE_READY: EngineState
ENGINE_STATE_DRAINING: EngineState
ENGINE_STATE_STOPPING: EngineState
ENGINE_STATE_CRASHED: EngineState
ENGINE_STATE_STOPPED: EngineState
ENGINE_STATE_FAILED: EngineState
COMMAND_OUTCOME_UNSPECIFIED: CommandOutcome
COMMAND_OUTCOME_SUCCEEDED: CommandOutcome
COMMAND_OUTCOME_FAILED: CommandOutcome
COMMAND_OUTCOME_REJECTED: CommandOutcome
PROVIDER_ACTION_UNSPECIFIED: ProviderAction
PROVIDER_ACTION_RESTART: ProviderAction
PROVIDER_ACTION_STOP: ProviderAction
PROVIDER_ACTION_START: ProviderAction
PROVIDER_ACTION_LOGS: ProviderAction
INFERENCE_ENDPOINT_UNSPECIFIED: InferenceEndpoint
INFERENCE_ENDPOINT_CHAT_COMPLETIONS: InferenceEndpoint
INFERENCE_ENDPOINT_COMPLETIONS: InferenceEndpoint
INFERENCE_ENDPOINT_EMBEDDINGS: InferenceEndpoint
INFERENCE_STATUS_UNSPECIFIED: InferenceStatus
INFERENCE_STATUS_OK: InferenceStatus
INFERENCE_STATUS_PROVIDER_ERROR: InferenceStatus
INFERENCE_STATUS_CANCELLED: InferenceStatus
INFERENCE_STATUS_REJECTED: InferenceStatus
INFERENCE_STATUS_UNAVAILABLE: InferenceStatus
INSTANCE_STATE_UNSPECIFIED: InstanceState
INSTANCE_STATE_PENDING: InstanceState
INSTANCE_STATE_STARTING: InstanceState
INSTANCE_STATE_READY: InstanceState
INSTANCE_STATE_FAILED: InstanceState
INSTANCE_STATE_REFUSED: InstanceState
INSTANCE_STATE_STOPPING: InstanceState
INSTANCE_STATE_STOPPED: InstanceState
INSTANCE_STATE_DRIFTED: InstanceState

class Error(_message.Message):
    __slots__ = ("code", "message")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: ErrorCode
    message: str
    def __init__(self, code: _Optional[_Union[ErrorCode, str]] = ..., message: _Optional[str] = ...) -> None: ...

class Ping(_message.Message):
    __slots__ = ("sent_at_ms",)
    SENT_AT_MS_FIELD_NUMBER: _ClassVar[int]
    sent_at_ms: int
    def __init__(self, sent_at_ms: _Optional[int] = ...) -> None: ...

class Pong(_message.Message):
    __slots__ = ("ping_sent_at_ms",)
    PING_SENT_AT_MS_FIELD_NUMBER: _ClassVar[int]
    ping_sent_at_ms: int
    def __init__(self, ping_sent_at_ms: _Optional[int] = ...) -> None: ...

class CommandArgumentSpec(_message.Message):
    __slots__ = ("name", "description", "required")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    REQUIRED_FIELD_NUMBER: _ClassVar[int]
    name: str
    description: str
    required: bool
    def __init__(self, name: _Optional[str] = ..., description: _Optional[str] = ..., required: _Optional[bool] = ...) -> None: ...

class CommandSpec(_message.Message):
    __slots__ = ("name", "description", "target_kind", "arguments")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    TARGET_KIND_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_FIELD_NUMBER: _ClassVar[int]
    name: str
    description: str
    target_kind: str
    arguments: _containers.RepeatedCompositeFieldContainer[CommandArgumentSpec]
    def __init__(self, name: _Optional[str] = ..., description: _Optional[str] = ..., target_kind: _Optional[str] = ..., arguments: _Optional[_Iterable[_Union[CommandArgumentSpec, _Mapping]]] = ...) -> None: ...

class EdgeHelloRequest(_message.Message):
    __slots__ = ("edge_id", "protocol_major", "protocol_minor", "software_version", "credential", "labels", "commands")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    EDGE_ID_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_MAJOR_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_MINOR_FIELD_NUMBER: _ClassVar[int]
    SOFTWARE_VERSION_FIELD_NUMBER: _ClassVar[int]
    CREDENTIAL_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    COMMANDS_FIELD_NUMBER: _ClassVar[int]
    edge_id: str
    protocol_major: int
    protocol_minor: int
    software_version: str
    credential: str
    labels: _containers.ScalarMap[str, str]
    commands: _containers.RepeatedCompositeFieldContainer[CommandSpec]
    def __init__(self, edge_id: _Optional[str] = ..., protocol_major: _Optional[int] = ..., protocol_minor: _Optional[int] = ..., software_version: _Optional[str] = ..., credential: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., commands: _Optional[_Iterable[_Union[CommandSpec, _Mapping]]] = ...) -> None: ...

class EdgeHelloResponse(_message.Message):
    __slots__ = ("accepted", "reason", "reason_code", "permanent", "protocol_major", "protocol_minor", "server_version", "keepalive_interval_ms", "keepalive_deadline_ms", "retry_after_ms")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    REASON_CODE_FIELD_NUMBER: _ClassVar[int]
    PERMANENT_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_MAJOR_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_MINOR_FIELD_NUMBER: _ClassVar[int]
    SERVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    KEEPALIVE_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    KEEPALIVE_DEADLINE_MS_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_MS_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    reason: str
    reason_code: str
    permanent: bool
    protocol_major: int
    protocol_minor: int
    server_version: str
    keepalive_interval_ms: int
    keepalive_deadline_ms: int
    retry_after_ms: int
    def __init__(self, accepted: _Optional[bool] = ..., reason: _Optional[str] = ..., reason_code: _Optional[str] = ..., permanent: _Optional[bool] = ..., protocol_major: _Optional[int] = ..., protocol_minor: _Optional[int] = ..., server_version: _Optional[str] = ..., keepalive_interval_ms: _Optional[int] = ..., keepalive_deadline_ms: _Optional[int] = ..., retry_after_ms: _Optional[int] = ...) -> None: ...

class EdgeStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ProviderSnapshot(_message.Message):
    __slots__ = ("provider_id", "kind", "models", "status", "health", "health_reason", "capacity", "in_flight", "queued", "long_context_capacity", "long_context_in_flight", "long_context_queued", "engine", "tokens_per_second", "prompt_tokens", "completion_tokens", "saturated", "cooling_down", "launch", "latency", "deployment", "estimated_prompt_tokens", "estimated_completion_tokens")
    PROVIDER_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    HEALTH_FIELD_NUMBER: _ClassVar[int]
    HEALTH_REASON_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    LONG_CONTEXT_CAPACITY_FIELD_NUMBER: _ClassVar[int]
    LONG_CONTEXT_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    LONG_CONTEXT_QUEUED_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SATURATED_FIELD_NUMBER: _ClassVar[int]
    COOLING_DOWN_FIELD_NUMBER: _ClassVar[int]
    LAUNCH_FIELD_NUMBER: _ClassVar[int]
    LATENCY_FIELD_NUMBER: _ClassVar[int]
    DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    ESTIMATED_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ESTIMATED_COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    provider_id: str
    kind: str
    models: _containers.RepeatedScalarFieldContainer[str]
    status: ProviderStatus
    health: ProviderHealth
    health_reason: str
    capacity: int
    in_flight: int
    queued: int
    long_context_capacity: int
    long_context_in_flight: int
    long_context_queued: int
    engine: EngineLoad
    tokens_per_second: float
    prompt_tokens: int
    completion_tokens: int
    saturated: bool
    cooling_down: bool
    launch: EngineLaunch
    latency: ProviderLatency
    deployment: str
    estimated_prompt_tokens: int
    estimated_completion_tokens: int
    def __init__(self, provider_id: _Optional[str] = ..., kind: _Optional[str] = ..., models: _Optional[_Iterable[str]] = ..., status: _Optional[_Union[ProviderStatus, str]] = ..., health: _Optional[_Union[ProviderHealth, str]] = ..., health_reason: _Optional[str] = ..., capacity: _Optional[int] = ..., in_flight: _Optional[int] = ..., queued: _Optional[int] = ..., long_context_capacity: _Optional[int] = ..., long_context_in_flight: _Optional[int] = ..., long_context_queued: _Optional[int] = ..., engine: _Optional[_Union[EngineLoad, _Mapping]] = ..., tokens_per_second: _Optional[float] = ..., prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., saturated: _Optional[bool] = ..., cooling_down: _Optional[bool] = ..., launch: _Optional[_Union[EngineLaunch, _Mapping]] = ..., latency: _Optional[_Union[ProviderLatency, _Mapping]] = ..., deployment: _Optional[str] = ..., estimated_prompt_tokens: _Optional[int] = ..., estimated_completion_tokens: _Optional[int] = ...) -> None: ...

class LatencySketch(_message.Message):
    __slots__ = ("index", "count", "sum_seconds")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    SUM_SECONDS_FIELD_NUMBER: _ClassVar[int]
    index: _containers.RepeatedScalarFieldContainer[int]
    count: _containers.RepeatedScalarFieldContainer[int]
    sum_seconds: float
    def __init__(self, index: _Optional[_Iterable[int]] = ..., count: _Optional[_Iterable[int]] = ..., sum_seconds: _Optional[float] = ...) -> None: ...

class ProviderLatency(_message.Message):
    __slots__ = ("ttft_recent", "tpot_recent", "duration_recent", "window_seconds", "ttft_total", "tpot_total", "duration_total", "requests_total", "errors_total", "counting_since_ms", "requests_recent", "errors_recent")
    TTFT_RECENT_FIELD_NUMBER: _ClassVar[int]
    TPOT_RECENT_FIELD_NUMBER: _ClassVar[int]
    DURATION_RECENT_FIELD_NUMBER: _ClassVar[int]
    WINDOW_SECONDS_FIELD_NUMBER: _ClassVar[int]
    TTFT_TOTAL_FIELD_NUMBER: _ClassVar[int]
    TPOT_TOTAL_FIELD_NUMBER: _ClassVar[int]
    DURATION_TOTAL_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    ERRORS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    COUNTING_SINCE_MS_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_RECENT_FIELD_NUMBER: _ClassVar[int]
    ERRORS_RECENT_FIELD_NUMBER: _ClassVar[int]
    ttft_recent: LatencySketch
    tpot_recent: LatencySketch
    duration_recent: LatencySketch
    window_seconds: float
    ttft_total: LatencySketch
    tpot_total: LatencySketch
    duration_total: LatencySketch
    requests_total: int
    errors_total: int
    counting_since_ms: int
    requests_recent: int
    errors_recent: int
    def __init__(self, ttft_recent: _Optional[_Union[LatencySketch, _Mapping]] = ..., tpot_recent: _Optional[_Union[LatencySketch, _Mapping]] = ..., duration_recent: _Optional[_Union[LatencySketch, _Mapping]] = ..., window_seconds: _Optional[float] = ..., ttft_total: _Optional[_Union[LatencySketch, _Mapping]] = ..., tpot_total: _Optional[_Union[LatencySketch, _Mapping]] = ..., duration_total: _Optional[_Union[LatencySketch, _Mapping]] = ..., requests_total: _Optional[int] = ..., errors_total: _Optional[int] = ..., counting_since_ms: _Optional[int] = ..., requests_recent: _Optional[int] = ..., errors_recent: _Optional[int] = ...) -> None: ...

class EngineLaunch(_message.Message):
    __slots__ = ("state", "reason", "restarts", "next_try_at_ms", "since_ms", "pid")
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    RESTARTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_TRY_AT_MS_FIELD_NUMBER: _ClassVar[int]
    SINCE_MS_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    state: EngineState
    reason: str
    restarts: int
    next_try_at_ms: int
    since_ms: int
    pid: int
    def __init__(self, state: _Optional[_Union[EngineState, str]] = ..., reason: _Optional[str] = ..., restarts: _Optional[int] = ..., next_try_at_ms: _Optional[int] = ..., since_ms: _Optional[int] = ..., pid: _Optional[int] = ...) -> None: ...

class EngineLoad(_message.Message):
    __slots__ = ("known", "running", "waiting", "kv_cache_usage", "parallel", "age_ms")
    KNOWN_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    KV_CACHE_USAGE_FIELD_NUMBER: _ClassVar[int]
    PARALLEL_FIELD_NUMBER: _ClassVar[int]
    AGE_MS_FIELD_NUMBER: _ClassVar[int]
    known: bool
    running: int
    waiting: int
    kv_cache_usage: float
    parallel: int
    age_ms: int
    def __init__(self, known: _Optional[bool] = ..., running: _Optional[int] = ..., waiting: _Optional[int] = ..., kv_cache_usage: _Optional[float] = ..., parallel: _Optional[int] = ..., age_ms: _Optional[int] = ...) -> None: ...

class EdgeNodeSnapshot(_message.Message):
    __slots__ = ("node_id", "connected", "drained", "connected_since_ms", "last_seen_ms", "providers", "labels", "profiles", "gpus", "free_gpus")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    CONNECTED_FIELD_NUMBER: _ClassVar[int]
    DRAINED_FIELD_NUMBER: _ClassVar[int]
    CONNECTED_SINCE_MS_FIELD_NUMBER: _ClassVar[int]
    LAST_SEEN_MS_FIELD_NUMBER: _ClassVar[int]
    PROVIDERS_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    PROFILES_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    FREE_GPUS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    connected: bool
    drained: bool
    connected_since_ms: int
    last_seen_ms: int
    providers: _containers.RepeatedCompositeFieldContainer[ProviderSnapshot]
    labels: _containers.ScalarMap[str, str]
    profiles: _containers.RepeatedCompositeFieldContainer[EngineProfile]
    gpus: int
    free_gpus: int
    def __init__(self, node_id: _Optional[str] = ..., connected: _Optional[bool] = ..., drained: _Optional[bool] = ..., connected_since_ms: _Optional[int] = ..., last_seen_ms: _Optional[int] = ..., providers: _Optional[_Iterable[_Union[ProviderSnapshot, _Mapping]]] = ..., labels: _Optional[_Mapping[str, str]] = ..., profiles: _Optional[_Iterable[_Union[EngineProfile, _Mapping]]] = ..., gpus: _Optional[int] = ..., free_gpus: _Optional[int] = ...) -> None: ...

class StatusTotals(_message.Message):
    __slots__ = ("nodes_connected", "nodes_configured", "providers", "providers_available", "providers_drained", "providers_unavailable", "providers_healthy", "providers_degraded", "providers_unhealthy", "providers_offline", "providers_unknown", "capacity", "in_flight", "queued", "long_context_capacity", "long_context_in_flight", "long_context_queued")
    NODES_CONNECTED_FIELD_NUMBER: _ClassVar[int]
    NODES_CONFIGURED_FIELD_NUMBER: _ClassVar[int]
    PROVIDERS_FIELD_NUMBER: _ClassVar[int]
    PROVIDERS_AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    PROVIDERS_DRAINED_FIELD_NUMBER: _ClassVar[int]
    PROVIDERS_UNAVAILABLE_FIELD_NUMBER: _ClassVar[int]
    PROVIDERS_HEALTHY_FIELD_NUMBER: _ClassVar[int]
    PROVIDERS_DEGRADED_FIELD_NUMBER: _ClassVar[int]
    PROVIDERS_UNHEALTHY_FIELD_NUMBER: _ClassVar[int]
    PROVIDERS_OFFLINE_FIELD_NUMBER: _ClassVar[int]
    PROVIDERS_UNKNOWN_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    LONG_CONTEXT_CAPACITY_FIELD_NUMBER: _ClassVar[int]
    LONG_CONTEXT_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    LONG_CONTEXT_QUEUED_FIELD_NUMBER: _ClassVar[int]
    nodes_connected: int
    nodes_configured: int
    providers: int
    providers_available: int
    providers_drained: int
    providers_unavailable: int
    providers_healthy: int
    providers_degraded: int
    providers_unhealthy: int
    providers_offline: int
    providers_unknown: int
    capacity: int
    in_flight: int
    queued: int
    long_context_capacity: int
    long_context_in_flight: int
    long_context_queued: int
    def __init__(self, nodes_connected: _Optional[int] = ..., nodes_configured: _Optional[int] = ..., providers: _Optional[int] = ..., providers_available: _Optional[int] = ..., providers_drained: _Optional[int] = ..., providers_unavailable: _Optional[int] = ..., providers_healthy: _Optional[int] = ..., providers_degraded: _Optional[int] = ..., providers_unhealthy: _Optional[int] = ..., providers_offline: _Optional[int] = ..., providers_unknown: _Optional[int] = ..., capacity: _Optional[int] = ..., in_flight: _Optional[int] = ..., queued: _Optional[int] = ..., long_context_capacity: _Optional[int] = ..., long_context_in_flight: _Optional[int] = ..., long_context_queued: _Optional[int] = ...) -> None: ...

class EdgeStatusResponse(_message.Message):
    __slots__ = ("edge_id", "generated_at_ms", "nodes", "totals", "observed_deployments_version", "instances", "held")
    EDGE_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    TOTALS_FIELD_NUMBER: _ClassVar[int]
    OBSERVED_DEPLOYMENTS_VERSION_FIELD_NUMBER: _ClassVar[int]
    INSTANCES_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    edge_id: str
    generated_at_ms: int
    nodes: _containers.RepeatedCompositeFieldContainer[EdgeNodeSnapshot]
    totals: StatusTotals
    observed_deployments_version: int
    instances: _containers.RepeatedCompositeFieldContainer[InstanceStatus]
    held: bool
    def __init__(self, edge_id: _Optional[str] = ..., generated_at_ms: _Optional[int] = ..., nodes: _Optional[_Iterable[_Union[EdgeNodeSnapshot, _Mapping]]] = ..., totals: _Optional[_Union[StatusTotals, _Mapping]] = ..., observed_deployments_version: _Optional[int] = ..., instances: _Optional[_Iterable[_Union[InstanceStatus, _Mapping]]] = ..., held: _Optional[bool] = ...) -> None: ...

class EdgeCommandRequest(_message.Message):
    __slots__ = ("command_id", "name", "target", "arguments", "timeout_ms")
    class ArgumentsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    COMMAND_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    command_id: str
    name: str
    target: str
    arguments: _containers.ScalarMap[str, str]
    timeout_ms: int
    def __init__(self, command_id: _Optional[str] = ..., name: _Optional[str] = ..., target: _Optional[str] = ..., arguments: _Optional[_Mapping[str, str]] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class EdgeCommandResponse(_message.Message):
    __slots__ = ("command_id", "outcome", "reason", "result")
    class ResultEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    COMMAND_ID_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    command_id: str
    outcome: CommandOutcome
    reason: str
    result: _containers.ScalarMap[str, str]
    def __init__(self, command_id: _Optional[str] = ..., outcome: _Optional[_Union[CommandOutcome, str]] = ..., reason: _Optional[str] = ..., result: _Optional[_Mapping[str, str]] = ...) -> None: ...

class EdgeEvent(_message.Message):
    __slots__ = ("kind", "occurred_at_ms", "node_id", "provider_id", "command_id", "message", "attributes", "edge_sequence")
    class AttributesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    KIND_FIELD_NUMBER: _ClassVar[int]
    OCCURRED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_ID_FIELD_NUMBER: _ClassVar[int]
    COMMAND_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    EDGE_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    kind: str
    occurred_at_ms: int
    node_id: str
    provider_id: str
    command_id: str
    message: str
    attributes: _containers.ScalarMap[str, str]
    edge_sequence: int
    def __init__(self, kind: _Optional[str] = ..., occurred_at_ms: _Optional[int] = ..., node_id: _Optional[str] = ..., provider_id: _Optional[str] = ..., command_id: _Optional[str] = ..., message: _Optional[str] = ..., attributes: _Optional[_Mapping[str, str]] = ..., edge_sequence: _Optional[int] = ...) -> None: ...

class NodeProviderSpec(_message.Message):
    __slots__ = ("provider_id", "kind", "models")
    PROVIDER_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    provider_id: str
    kind: str
    models: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, provider_id: _Optional[str] = ..., kind: _Optional[str] = ..., models: _Optional[_Iterable[str]] = ...) -> None: ...

class NodeHelloRequest(_message.Message):
    __slots__ = ("node_id", "protocol_major", "protocol_minor", "software_version", "credential", "providers", "labels", "profiles", "gpus", "free_gpus")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_MAJOR_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_MINOR_FIELD_NUMBER: _ClassVar[int]
    SOFTWARE_VERSION_FIELD_NUMBER: _ClassVar[int]
    CREDENTIAL_FIELD_NUMBER: _ClassVar[int]
    PROVIDERS_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    PROFILES_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    FREE_GPUS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    protocol_major: int
    protocol_minor: int
    software_version: str
    credential: str
    providers: _containers.RepeatedCompositeFieldContainer[NodeProviderSpec]
    labels: _containers.ScalarMap[str, str]
    profiles: _containers.RepeatedCompositeFieldContainer[EngineProfile]
    gpus: int
    free_gpus: int
    def __init__(self, node_id: _Optional[str] = ..., protocol_major: _Optional[int] = ..., protocol_minor: _Optional[int] = ..., software_version: _Optional[str] = ..., credential: _Optional[str] = ..., providers: _Optional[_Iterable[_Union[NodeProviderSpec, _Mapping]]] = ..., labels: _Optional[_Mapping[str, str]] = ..., profiles: _Optional[_Iterable[_Union[EngineProfile, _Mapping]]] = ..., gpus: _Optional[int] = ..., free_gpus: _Optional[int] = ...) -> None: ...

class NodeHelloResponse(_message.Message):
    __slots__ = ("accepted", "reason", "reason_code", "permanent", "protocol_major", "protocol_minor", "server_version", "keepalive_interval_ms", "keepalive_deadline_ms")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    REASON_CODE_FIELD_NUMBER: _ClassVar[int]
    PERMANENT_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_MAJOR_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_MINOR_FIELD_NUMBER: _ClassVar[int]
    SERVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    KEEPALIVE_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    KEEPALIVE_DEADLINE_MS_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    reason: str
    reason_code: str
    permanent: bool
    protocol_major: int
    protocol_minor: int
    server_version: str
    keepalive_interval_ms: int
    keepalive_deadline_ms: int
    def __init__(self, accepted: _Optional[bool] = ..., reason: _Optional[str] = ..., reason_code: _Optional[str] = ..., permanent: _Optional[bool] = ..., protocol_major: _Optional[int] = ..., protocol_minor: _Optional[int] = ..., server_version: _Optional[str] = ..., keepalive_interval_ms: _Optional[int] = ..., keepalive_deadline_ms: _Optional[int] = ...) -> None: ...

class ProviderHealthReport(_message.Message):
    __slots__ = ("provider_id", "health", "reason", "models", "launch")
    PROVIDER_ID_FIELD_NUMBER: _ClassVar[int]
    HEALTH_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    LAUNCH_FIELD_NUMBER: _ClassVar[int]
    provider_id: str
    health: ProviderHealth
    reason: str
    models: _containers.RepeatedScalarFieldContainer[str]
    launch: EngineLaunch
    def __init__(self, provider_id: _Optional[str] = ..., health: _Optional[_Union[ProviderHealth, str]] = ..., reason: _Optional[str] = ..., models: _Optional[_Iterable[str]] = ..., launch: _Optional[_Union[EngineLaunch, _Mapping]] = ...) -> None: ...

class NodeReady(_message.Message):
    __slots__ = ("providers",)
    PROVIDERS_FIELD_NUMBER: _ClassVar[int]
    providers: _containers.RepeatedCompositeFieldContainer[ProviderHealthReport]
    def __init__(self, providers: _Optional[_Iterable[_Union[ProviderHealthReport, _Mapping]]] = ...) -> None: ...

class NodeHealthReport(_message.Message):
    __slots__ = ("providers",)
    PROVIDERS_FIELD_NUMBER: _ClassVar[int]
    providers: _containers.RepeatedCompositeFieldContainer[ProviderHealthReport]
    def __init__(self, providers: _Optional[_Iterable[_Union[ProviderHealthReport, _Mapping]]] = ...) -> None: ...

class ProviderLoadReport(_message.Message):
    __slots__ = ("provider_id", "load")
    PROVIDER_ID_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    provider_id: str
    load: EngineLoad
    def __init__(self, provider_id: _Optional[str] = ..., load: _Optional[_Union[EngineLoad, _Mapping]] = ...) -> None: ...

class NodeLoadReport(_message.Message):
    __slots__ = ("providers",)
    PROVIDERS_FIELD_NUMBER: _ClassVar[int]
    providers: _containers.RepeatedCompositeFieldContainer[ProviderLoadReport]
    def __init__(self, providers: _Optional[_Iterable[_Union[ProviderLoadReport, _Mapping]]] = ...) -> None: ...

class NodeProbeRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class NodeProbeResponse(_message.Message):
    __slots__ = ("providers", "health")
    PROVIDERS_FIELD_NUMBER: _ClassVar[int]
    HEALTH_FIELD_NUMBER: _ClassVar[int]
    providers: _containers.RepeatedCompositeFieldContainer[NodeProviderSpec]
    health: _containers.RepeatedCompositeFieldContainer[ProviderHealthReport]
    def __init__(self, providers: _Optional[_Iterable[_Union[NodeProviderSpec, _Mapping]]] = ..., health: _Optional[_Iterable[_Union[ProviderHealthReport, _Mapping]]] = ...) -> None: ...

class NodeProviderCommandRequest(_message.Message):
    __slots__ = ("provider_id", "action", "drain", "drain_timeout_ms", "timeout_ms", "max_log_bytes")
    PROVIDER_ID_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    DRAIN_FIELD_NUMBER: _ClassVar[int]
    DRAIN_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_LOG_BYTES_FIELD_NUMBER: _ClassVar[int]
    provider_id: str
    action: ProviderAction
    drain: bool
    drain_timeout_ms: int
    timeout_ms: int
    max_log_bytes: int
    def __init__(self, provider_id: _Optional[str] = ..., action: _Optional[_Union[ProviderAction, str]] = ..., drain: _Optional[bool] = ..., drain_timeout_ms: _Optional[int] = ..., timeout_ms: _Optional[int] = ..., max_log_bytes: _Optional[int] = ...) -> None: ...

class NodeProviderCommandResponse(_message.Message):
    __slots__ = ("ok", "reason", "launch", "log_text", "log_lines", "drained_requests", "cut_requests")
    OK_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    LAUNCH_FIELD_NUMBER: _ClassVar[int]
    LOG_TEXT_FIELD_NUMBER: _ClassVar[int]
    LOG_LINES_FIELD_NUMBER: _ClassVar[int]
    DRAINED_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    CUT_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    ok: bool
    reason: str
    launch: EngineLaunch
    log_text: str
    log_lines: int
    drained_requests: int
    cut_requests: int
    def __init__(self, ok: _Optional[bool] = ..., reason: _Optional[str] = ..., launch: _Optional[_Union[EngineLaunch, _Mapping]] = ..., log_text: _Optional[str] = ..., log_lines: _Optional[int] = ..., drained_requests: _Optional[int] = ..., cut_requests: _Optional[int] = ...) -> None: ...

class InferenceRequest(_message.Message):
    __slots__ = ("inference_id", "provider_id", "endpoint", "body", "stream", "model", "traceparent", "tracestate")
    INFERENCE_ID_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_ID_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TRACEPARENT_FIELD_NUMBER: _ClassVar[int]
    TRACESTATE_FIELD_NUMBER: _ClassVar[int]
    inference_id: int
    provider_id: str
    endpoint: InferenceEndpoint
    body: bytes
    stream: bool
    model: str
    traceparent: str
    tracestate: str
    def __init__(self, inference_id: _Optional[int] = ..., provider_id: _Optional[str] = ..., endpoint: _Optional[_Union[InferenceEndpoint, str]] = ..., body: _Optional[bytes] = ..., stream: _Optional[bool] = ..., model: _Optional[str] = ..., traceparent: _Optional[str] = ..., tracestate: _Optional[str] = ...) -> None: ...

class InferenceChunk(_message.Message):
    __slots__ = ("inference_id", "data")
    INFERENCE_ID_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    inference_id: int
    data: bytes
    def __init__(self, inference_id: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class InferenceUsage(_message.Message):
    __slots__ = ("prompt_tokens", "completion_tokens", "total_tokens", "estimated")
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ESTIMATED_FIELD_NUMBER: _ClassVar[int]
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    estimated: bool
    def __init__(self, prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., total_tokens: _Optional[int] = ..., estimated: _Optional[bool] = ...) -> None: ...

class InferenceDone(_message.Message):
    __slots__ = ("inference_id", "status", "http_status", "body", "usage", "error", "chunks", "error_code", "retry_after_seconds")
    INFERENCE_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    HTTP_STATUS_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_SECONDS_FIELD_NUMBER: _ClassVar[int]
    inference_id: int
    status: InferenceStatus
    http_status: int
    body: bytes
    usage: InferenceUsage
    error: str
    chunks: int
    error_code: str
    retry_after_seconds: int
    def __init__(self, inference_id: _Optional[int] = ..., status: _Optional[_Union[InferenceStatus, str]] = ..., http_status: _Optional[int] = ..., body: _Optional[bytes] = ..., usage: _Optional[_Union[InferenceUsage, _Mapping]] = ..., error: _Optional[str] = ..., chunks: _Optional[int] = ..., error_code: _Optional[str] = ..., retry_after_seconds: _Optional[int] = ...) -> None: ...

class InferenceCancel(_message.Message):
    __slots__ = ("inference_id", "reason")
    INFERENCE_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    inference_id: int
    reason: str
    def __init__(self, inference_id: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class ProfileParameter(_message.Message):
    __slots__ = ("name", "type", "has_bounds", "minimum", "maximum", "choices", "pattern", "has_default", "default")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    HAS_BOUNDS_FIELD_NUMBER: _ClassVar[int]
    MINIMUM_FIELD_NUMBER: _ClassVar[int]
    MAXIMUM_FIELD_NUMBER: _ClassVar[int]
    CHOICES_FIELD_NUMBER: _ClassVar[int]
    PATTERN_FIELD_NUMBER: _ClassVar[int]
    HAS_DEFAULT_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_FIELD_NUMBER: _ClassVar[int]
    name: str
    type: str
    has_bounds: bool
    minimum: float
    maximum: float
    choices: _containers.RepeatedScalarFieldContainer[str]
    pattern: str
    has_default: bool
    default: str
    def __init__(self, name: _Optional[str] = ..., type: _Optional[str] = ..., has_bounds: _Optional[bool] = ..., minimum: _Optional[float] = ..., maximum: _Optional[float] = ..., choices: _Optional[_Iterable[str]] = ..., pattern: _Optional[str] = ..., has_default: _Optional[bool] = ..., default: _Optional[str] = ...) -> None: ...

class EngineProfile(_message.Message):
    __slots__ = ("name", "kind", "parameters", "free_ports", "gpus_per_instance")
    NAME_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    FREE_PORTS_FIELD_NUMBER: _ClassVar[int]
    GPUS_PER_INSTANCE_FIELD_NUMBER: _ClassVar[int]
    name: str
    kind: str
    parameters: _containers.RepeatedCompositeFieldContainer[ProfileParameter]
    free_ports: int
    gpus_per_instance: int
    def __init__(self, name: _Optional[str] = ..., kind: _Optional[str] = ..., parameters: _Optional[_Iterable[_Union[ProfileParameter, _Mapping]]] = ..., free_ports: _Optional[int] = ..., gpus_per_instance: _Optional[int] = ...) -> None: ...

class DesiredInstance(_message.Message):
    __slots__ = ("instance_id", "deployment", "generation", "node_id", "profile", "model", "parameters", "capacity", "spec_hash")
    class ParametersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    SPEC_HASH_FIELD_NUMBER: _ClassVar[int]
    instance_id: str
    deployment: str
    generation: int
    node_id: str
    profile: str
    model: str
    parameters: _containers.ScalarMap[str, str]
    capacity: int
    spec_hash: str
    def __init__(self, instance_id: _Optional[str] = ..., deployment: _Optional[str] = ..., generation: _Optional[int] = ..., node_id: _Optional[str] = ..., profile: _Optional[str] = ..., model: _Optional[str] = ..., parameters: _Optional[_Mapping[str, str]] = ..., capacity: _Optional[int] = ..., spec_hash: _Optional[str] = ...) -> None: ...

class InstanceStatus(_message.Message):
    __slots__ = ("instance_id", "deployment", "generation", "node_id", "spec_hash", "state", "reason", "since_ms")
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    DEPLOYMENT_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    SPEC_HASH_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    SINCE_MS_FIELD_NUMBER: _ClassVar[int]
    instance_id: str
    deployment: str
    generation: int
    node_id: str
    spec_hash: str
    state: InstanceState
    reason: str
    since_ms: int
    def __init__(self, instance_id: _Optional[str] = ..., deployment: _Optional[str] = ..., generation: _Optional[int] = ..., node_id: _Optional[str] = ..., spec_hash: _Optional[str] = ..., state: _Optional[_Union[InstanceState, str]] = ..., reason: _Optional[str] = ..., since_ms: _Optional[int] = ...) -> None: ...

class EdgeDeploymentsRequest(_message.Message):
    __slots__ = ("version", "instances")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    INSTANCES_FIELD_NUMBER: _ClassVar[int]
    version: int
    instances: _containers.RepeatedCompositeFieldContainer[DesiredInstance]
    def __init__(self, version: _Optional[int] = ..., instances: _Optional[_Iterable[_Union[DesiredInstance, _Mapping]]] = ...) -> None: ...

class EdgeDeploymentsResponse(_message.Message):
    __slots__ = ("observed_version", "instances", "held")
    OBSERVED_VERSION_FIELD_NUMBER: _ClassVar[int]
    INSTANCES_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    observed_version: int
    instances: _containers.RepeatedCompositeFieldContainer[InstanceStatus]
    held: bool
    def __init__(self, observed_version: _Optional[int] = ..., instances: _Optional[_Iterable[_Union[InstanceStatus, _Mapping]]] = ..., held: _Optional[bool] = ...) -> None: ...

class NodeInstancesRequest(_message.Message):
    __slots__ = ("instances",)
    INSTANCES_FIELD_NUMBER: _ClassVar[int]
    instances: _containers.RepeatedCompositeFieldContainer[DesiredInstance]
    def __init__(self, instances: _Optional[_Iterable[_Union[DesiredInstance, _Mapping]]] = ...) -> None: ...

class NodeInstancesResponse(_message.Message):
    __slots__ = ("instances", "profiles", "free_gpus")
    INSTANCES_FIELD_NUMBER: _ClassVar[int]
    PROFILES_FIELD_NUMBER: _ClassVar[int]
    FREE_GPUS_FIELD_NUMBER: _ClassVar[int]
    instances: _containers.RepeatedCompositeFieldContainer[InstanceStatus]
    profiles: _containers.RepeatedCompositeFieldContainer[EngineProfile]
    free_gpus: int
    def __init__(self, instances: _Optional[_Iterable[_Union[InstanceStatus, _Mapping]]] = ..., profiles: _Optional[_Iterable[_Union[EngineProfile, _Mapping]]] = ..., free_gpus: _Optional[int] = ...) -> None: ...

class NodeInstancesReport(_message.Message):
    __slots__ = ("instances", "profiles", "free_gpus")
    INSTANCES_FIELD_NUMBER: _ClassVar[int]
    PROFILES_FIELD_NUMBER: _ClassVar[int]
    FREE_GPUS_FIELD_NUMBER: _ClassVar[int]
    instances: _containers.RepeatedCompositeFieldContainer[InstanceStatus]
    profiles: _containers.RepeatedCompositeFieldContainer[EngineProfile]
    free_gpus: int
    def __init__(self, instances: _Optional[_Iterable[_Union[InstanceStatus, _Mapping]]] = ..., profiles: _Optional[_Iterable[_Union[EngineProfile, _Mapping]]] = ..., free_gpus: _Optional[int] = ...) -> None: ...

class Envelope(_message.Message):
    __slots__ = ("request_id", "error", "ping", "pong", "edge_hello_request", "edge_hello_response", "edge_status_request", "edge_status_response", "edge_command_request", "edge_command_response", "edge_event", "edge_deployments_request", "edge_deployments_response", "node_hello_request", "node_hello_response", "node_ready", "node_health_report", "node_probe_request", "node_probe_response", "node_load_report", "node_provider_command_request", "node_provider_command_response", "node_instances_request", "node_instances_response", "node_instances_report", "inference_request", "inference_chunk", "inference_done", "inference_cancel")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    PING_FIELD_NUMBER: _ClassVar[int]
    PONG_FIELD_NUMBER: _ClassVar[int]
    EDGE_HELLO_REQUEST_FIELD_NUMBER: _ClassVar[int]
    EDGE_HELLO_RESPONSE_FIELD_NUMBER: _ClassVar[int]
    EDGE_STATUS_REQUEST_FIELD_NUMBER: _ClassVar[int]
    EDGE_STATUS_RESPONSE_FIELD_NUMBER: _ClassVar[int]
    EDGE_COMMAND_REQUEST_FIELD_NUMBER: _ClassVar[int]
    EDGE_COMMAND_RESPONSE_FIELD_NUMBER: _ClassVar[int]
    EDGE_EVENT_FIELD_NUMBER: _ClassVar[int]
    EDGE_DEPLOYMENTS_REQUEST_FIELD_NUMBER: _ClassVar[int]
    EDGE_DEPLOYMENTS_RESPONSE_FIELD_NUMBER: _ClassVar[int]
    NODE_HELLO_REQUEST_FIELD_NUMBER: _ClassVar[int]
    NODE_HELLO_RESPONSE_FIELD_NUMBER: _ClassVar[int]
    NODE_READY_FIELD_NUMBER: _ClassVar[int]
    NODE_HEALTH_REPORT_FIELD_NUMBER: _ClassVar[int]
    NODE_PROBE_REQUEST_FIELD_NUMBER: _ClassVar[int]
    NODE_PROBE_RESPONSE_FIELD_NUMBER: _ClassVar[int]
    NODE_LOAD_REPORT_FIELD_NUMBER: _ClassVar[int]
    NODE_PROVIDER_COMMAND_REQUEST_FIELD_NUMBER: _ClassVar[int]
    NODE_PROVIDER_COMMAND_RESPONSE_FIELD_NUMBER: _ClassVar[int]
    NODE_INSTANCES_REQUEST_FIELD_NUMBER: _ClassVar[int]
    NODE_INSTANCES_RESPONSE_FIELD_NUMBER: _ClassVar[int]
    NODE_INSTANCES_REPORT_FIELD_NUMBER: _ClassVar[int]
    INFERENCE_REQUEST_FIELD_NUMBER: _ClassVar[int]
    INFERENCE_CHUNK_FIELD_NUMBER: _ClassVar[int]
    INFERENCE_DONE_FIELD_NUMBER: _ClassVar[int]
    INFERENCE_CANCEL_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    error: Error
    ping: Ping
    pong: Pong
    edge_hello_request: EdgeHelloRequest
    edge_hello_response: EdgeHelloResponse
    edge_status_request: EdgeStatusRequest
    edge_status_response: EdgeStatusResponse
    edge_command_request: EdgeCommandRequest
    edge_command_response: EdgeCommandResponse
    edge_event: EdgeEvent
    edge_deployments_request: EdgeDeploymentsRequest
    edge_deployments_response: EdgeDeploymentsResponse
    node_hello_request: NodeHelloRequest
    node_hello_response: NodeHelloResponse
    node_ready: NodeReady
    node_health_report: NodeHealthReport
    node_probe_request: NodeProbeRequest
    node_probe_response: NodeProbeResponse
    node_load_report: NodeLoadReport
    node_provider_command_request: NodeProviderCommandRequest
    node_provider_command_response: NodeProviderCommandResponse
    node_instances_request: NodeInstancesRequest
    node_instances_response: NodeInstancesResponse
    node_instances_report: NodeInstancesReport
    inference_request: InferenceRequest
    inference_chunk: InferenceChunk
    inference_done: InferenceDone
    inference_cancel: InferenceCancel
    def __init__(self, request_id: _Optional[int] = ..., error: _Optional[_Union[Error, _Mapping]] = ..., ping: _Optional[_Union[Ping, _Mapping]] = ..., pong: _Optional[_Union[Pong, _Mapping]] = ..., edge_hello_request: _Optional[_Union[EdgeHelloRequest, _Mapping]] = ..., edge_hello_response: _Optional[_Union[EdgeHelloResponse, _Mapping]] = ..., edge_status_request: _Optional[_Union[EdgeStatusRequest, _Mapping]] = ..., edge_status_response: _Optional[_Union[EdgeStatusResponse, _Mapping]] = ..., edge_command_request: _Optional[_Union[EdgeCommandRequest, _Mapping]] = ..., edge_command_response: _Optional[_Union[EdgeCommandResponse, _Mapping]] = ..., edge_event: _Optional[_Union[EdgeEvent, _Mapping]] = ..., edge_deployments_request: _Optional[_Union[EdgeDeploymentsRequest, _Mapping]] = ..., edge_deployments_response: _Optional[_Union[EdgeDeploymentsResponse, _Mapping]] = ..., node_hello_request: _Optional[_Union[NodeHelloRequest, _Mapping]] = ..., node_hello_response: _Optional[_Union[NodeHelloResponse, _Mapping]] = ..., node_ready: _Optional[_Union[NodeReady, _Mapping]] = ..., node_health_report: _Optional[_Union[NodeHealthReport, _Mapping]] = ..., node_probe_request: _Optional[_Union[NodeProbeRequest, _Mapping]] = ..., node_probe_response: _Optional[_Union[NodeProbeResponse, _Mapping]] = ..., node_load_report: _Optional[_Union[NodeLoadReport, _Mapping]] = ..., node_provider_command_request: _Optional[_Union[NodeProviderCommandRequest, _Mapping]] = ..., node_provider_command_response: _Optional[_Union[NodeProviderCommandResponse, _Mapping]] = ..., node_instances_request: _Optional[_Union[NodeInstancesRequest, _Mapping]] = ..., node_instances_response: _Optional[_Union[NodeInstancesResponse, _Mapping]] = ..., node_instances_report: _Optional[_Union[NodeInstancesReport, _Mapping]] = ..., inference_request: _Optional[_Union[InferenceRequest, _Mapping]] = ..., inference_chunk: _Optional[_Union[InferenceChunk, _Mapping]] = ..., inference_done: _Optional[_Union[InferenceDone, _Mapping]] = ..., inference_cancel: _Optional[_Union[InferenceCancel, _Mapping]] = ...) -> None: ...

class ClientHelloRequest(_message.Message):
    __slots__ = ("client_name", "protocol_major", "protocol_minor", "api_token")
    CLIENT_NAME_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_MAJOR_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_MINOR_FIELD_NUMBER: _ClassVar[int]
    API_TOKEN_FIELD_NUMBER: _ClassVar[int]
    client_name: str
    protocol_major: int
    protocol_minor: int
    api_token: str
    def __init__(self, client_name: _Optional[str] = ..., protocol_major: _Optional[int] = ..., protocol_minor: _Optional[int] = ..., api_token: _Optional[str] = ...) -> None: ...

class ClientHelloResponse(_message.Message):
    __slots__ = ("accepted", "reason", "server_version", "protocol_major", "protocol_minor", "features")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    SERVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_MAJOR_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_MINOR_FIELD_NUMBER: _ClassVar[int]
    FEATURES_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    reason: str
    server_version: str
    protocol_major: int
    protocol_minor: int
    features: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, accepted: _Optional[bool] = ..., reason: _Optional[str] = ..., server_version: _Optional[str] = ..., protocol_major: _Optional[int] = ..., protocol_minor: _Optional[int] = ..., features: _Optional[_Iterable[str]] = ...) -> None: ...

class SubscribeRequest(_message.Message):
    __slots__ = ("edge_id", "resume", "since_sequence")
    EDGE_ID_FIELD_NUMBER: _ClassVar[int]
    RESUME_FIELD_NUMBER: _ClassVar[int]
    SINCE_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    edge_id: str
    resume: bool
    since_sequence: int
    def __init__(self, edge_id: _Optional[str] = ..., resume: _Optional[bool] = ..., since_sequence: _Optional[int] = ...) -> None: ...

class SubscribeResponse(_message.Message):
    __slots__ = ("edge_id", "last_sequence", "oldest_sequence")
    EDGE_ID_FIELD_NUMBER: _ClassVar[int]
    LAST_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    OLDEST_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    edge_id: str
    last_sequence: int
    oldest_sequence: int
    def __init__(self, edge_id: _Optional[str] = ..., last_sequence: _Optional[int] = ..., oldest_sequence: _Optional[int] = ...) -> None: ...

class UnsubscribeRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class FleetEvent(_message.Message):
    __slots__ = ("sequence", "fleet_sequence", "edge_id", "kind", "occurred_at_ms", "recorded_at_ms", "node_id", "provider_id", "command_id", "message", "attributes")
    class AttributesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    FLEET_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    EDGE_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    OCCURRED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    RECORDED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_ID_FIELD_NUMBER: _ClassVar[int]
    COMMAND_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    fleet_sequence: int
    edge_id: str
    kind: str
    occurred_at_ms: int
    recorded_at_ms: int
    node_id: str
    provider_id: str
    command_id: str
    message: str
    attributes: _containers.ScalarMap[str, str]
    def __init__(self, sequence: _Optional[int] = ..., fleet_sequence: _Optional[int] = ..., edge_id: _Optional[str] = ..., kind: _Optional[str] = ..., occurred_at_ms: _Optional[int] = ..., recorded_at_ms: _Optional[int] = ..., node_id: _Optional[str] = ..., provider_id: _Optional[str] = ..., command_id: _Optional[str] = ..., message: _Optional[str] = ..., attributes: _Optional[_Mapping[str, str]] = ...) -> None: ...

class EventsLost(_message.Message):
    __slots__ = ("count", "first_sequence", "last_sequence", "reason")
    COUNT_FIELD_NUMBER: _ClassVar[int]
    FIRST_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    LAST_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    count: int
    first_sequence: int
    last_sequence: int
    reason: str
    def __init__(self, count: _Optional[int] = ..., first_sequence: _Optional[int] = ..., last_sequence: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class ClientEnvelope(_message.Message):
    __slots__ = ("request_id", "error", "client_hello_request", "client_hello_response", "subscribe_request", "subscribe_response", "unsubscribe_request", "event", "events_lost")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    CLIENT_HELLO_REQUEST_FIELD_NUMBER: _ClassVar[int]
    CLIENT_HELLO_RESPONSE_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIBE_REQUEST_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIBE_RESPONSE_FIELD_NUMBER: _ClassVar[int]
    UNSUBSCRIBE_REQUEST_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    EVENTS_LOST_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    error: Error
    client_hello_request: ClientHelloRequest
    client_hello_response: ClientHelloResponse
    subscribe_request: SubscribeRequest
    subscribe_response: SubscribeResponse
    unsubscribe_request: UnsubscribeRequest
    event: FleetEvent
    events_lost: EventsLost
    def __init__(self, request_id: _Optional[int] = ..., error: _Optional[_Union[Error, _Mapping]] = ..., client_hello_request: _Optional[_Union[ClientHelloRequest, _Mapping]] = ..., client_hello_response: _Optional[_Union[ClientHelloResponse, _Mapping]] = ..., subscribe_request: _Optional[_Union[SubscribeRequest, _Mapping]] = ..., subscribe_response: _Optional[_Union[SubscribeResponse, _Mapping]] = ..., unsubscribe_request: _Optional[_Union[UnsubscribeRequest, _Mapping]] = ..., event: _Optional[_Union[FleetEvent, _Mapping]] = ..., events_lost: _Optional[_Union[EventsLost, _Mapping]] = ...) -> None: ...

"""Abuse cases already proven by tests/server: referenced in the report, not duplicated.

Each entry is a test node id prefix (parametrized variants all count), the group of
the report table it belongs to, and what it tries.
"""

from __future__ import annotations

SECURITY = "tests/server/test_server_security.py::"
PROXY = "tests/server/test_server_proxy.py::"
CLOSES = "tests/server/test_server_closes.py::"

REFERENCED: list[tuple[str, str, str]] = [
    (SECURITY + "test_cross_origin_is_refused", "abuse", "cross-origin page: handshake 403"),
    (SECURITY + "test_allow_origin_list", "abuse", "origin outside --allow-origin: refused"),
    (SECURITY + "test_token_is_required", "abuse", "missing or wrong token: handshake 403"),
    (
        SECURITY + "test_malformed_frames_get_protocol_errors",
        "abuse",
        "malformed frames: cf_agent_protocol_error, connection stays usable",
    ),
    (
        SECURITY + "test_a_flood_of_malformed_frames_closes_with_1008",
        "abuse",
        "flood of malformed frames: close 1008, other session unaffected",
    ),
    (SECURITY + "test_oversize_frame_closes_with_1009", "abuse", "frame over the limit: 1009"),
    (
        SECURITY + "test_default_frame_limit_is_one_mebibyte",
        "abuse",
        "frame over the default 1 MiB limit: 1009",
    ),
    (
        CLOSES + "test_a_refused_frame_closes_with_a_close_frame",
        "abuse",
        "frame refused by the WebSocket layer (1009, 1007), peer slow to read: "
        "close frame, never a reset (1006)",
    ),
    (
        SECURITY + "test_bad_frames_never_touch_a_running_call",
        "abuse",
        "malformed result during a call: the call still completes",
    ),
    (
        PROXY + "test_result_from_another_connection_or_session_is_invalid",
        "abuse",
        "result for a requestId of another tab or session: invalid, real call unaffected",
    ),
    (
        PROXY + "test_registration_limits_in_the_ack",
        "abuse",
        "more than 128 tools, a ToolSpec over 64 KiB, duplicates: rejected in the ack",
    ),
    (PROXY + "test_oversize_result_is_invalid", "abuse", "result over 1,000,000 bytes: invalid"),
    (PROXY + "test_duplicate_result", "races", "second result for a settled call: duplicate"),
    (PROXY + "test_unknown_request_is_stale", "abuse", "result for an unknown requestId: stale"),
    (
        PROXY + "test_timeout_cancels_and_a_late_result_is_stale",
        "races",
        "result after the server timeout: stale",
    ),
]

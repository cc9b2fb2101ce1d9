"""Load hermes-agent's own modules from a copy outside berth ($BERTH_HERMES_REF,
default /work/hermes-ref; the files are hermes's, never part of berth: see
docs/hermes.md#tests). Each module is imported as hermes lays it out; what fails
to import is recorded, not stubbed."""

import importlib
import os
import sys

REF = os.environ.get("BERTH_HERMES_REF", "/work/hermes-ref")

#: The hermes modules the tests use, in import order.
MODULES = [
    "agent",  # agent/__init__.py (imports agent._openai_compat: a no-op without openai)
    "agent.provider_base",
    "agent.terminal_env_provider",
    "tools.interrupt",  # tools/ loads as a namespace package: tools/__init__.py is not copied
    # with base_output, base_session_env, base_wait, hermes_constants and
    # hermes_cli._subprocess_compat; tools/environments/__init__.py is not copied
    # (it imports definitions.py and forward_env.py too), so it is a namespace package
    "tools.environments.base",
]


def load() -> dict:
    """Import MODULES from REF; return {module: "ok" | "missing" | "error: ..."}."""
    status = {}
    if not os.path.isdir(REF):
        return {m: "missing: no hermes-agent copy at %s" % REF for m in MODULES}
    if REF not in sys.path:
        sys.path.insert(0, REF)
    for m in MODULES:
        try:
            importlib.import_module(m)
            status[m] = "ok"
        except ModuleNotFoundError as e:
            status[m] = "missing: %s" % e
        except Exception as e:  # a hermes import that needs what this machine lacks
            status[m] = "error: %s: %s" % (type(e).__name__, e)
    return status

"""berth_hermes: hermes-agent's terminal backend on berth.

hermes-agent (NousResearch/hermes-agent) runs its terminal, execute_code and file
tools through a terminal backend chosen by ``terminal.backend`` in
``~/.hermes/config.yaml``. This plugin registers one named ``berth``: each hermes
task id becomes a berth session (``hermes:{task_id}`` by default), and each command
runs in berth's shell mode in that session's sandbox, which berth's config places
(the host, a Docker or containerd container) and retires (``on_close``,
``idle_ttl``). See docs/hermes.md.

hermes loads it either from the ``hermes_agent.plugins`` entry point of this
package or as a directory plugin (``~/.hermes/plugins/berth/`` holding this
package's ``__init__.py`` and ``plugin.yaml``); either way it calls
:func:`register` with its plugin context.
"""

from .environment import BerthEnvironment, session_name
from .provider import BerthTerminalProvider

__version__ = "0.1.0"

__all__ = ["BerthEnvironment", "BerthTerminalProvider", "register", "session_name"]


def register(ctx) -> None:
    """hermes's plugin entry point: register the ``berth`` terminal backend
    (``ctx.register_terminal_environment_provider``, hermes's PluginContext)."""
    ctx.register_terminal_environment_provider(BerthTerminalProvider())

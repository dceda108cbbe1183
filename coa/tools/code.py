"""code: runs the Python program in a ```python fence in the sandbox (coa.tools.sandbox); math and code agents.

    tool = build(params.common.tools, ToolContext())
    tool("```python\\nprint(6 * 7)\\n```")   # '42\\n'
"""

from __future__ import annotations

from typing import Any

from coa.tools.context import Tool, ToolContext
from coa.tools.sandbox import SandboxLimits, run_python
from coa.tools.spec import code_source


def code_tool(limits: SandboxLimits) -> Tool:
    """The tool with `limits`."""

    def code(content: str) -> str:
        return run_python(code_source(content), limits=limits)

    return code


def build(cfg: Any, ctx: ToolContext) -> Tool:
    return code_tool(SandboxLimits(cpu_time_s=cfg.code_cpu_time_s, wall_time_s=cfg.code_wall_time_s,
                                   max_output_chars=cfg.max_observation_chars))

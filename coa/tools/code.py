"""code: runs the Python program in a ```python fence in the sandbox (coa.tools.sandbox); math and code agents.

    tool = SPEC.build(params.common.tools, ToolContext())
    tool("```python\\nprint(6 * 7)\\n```")   # '42\\n'
"""

from __future__ import annotations

from typing import Any

from coa.tools.spec import Tool, ToolContext, ToolSpec


def code_tool(limits: Any) -> Tool:
    """The tool with `limits` (coa.tools.sandbox.SandboxLimits)."""
    from coa.format import code_source
    from coa.tools.sandbox import run_python

    def code(content: str) -> str:
        return run_python(code_source(content), limits=limits)

    return code


def build(cfg: Any, ctx: ToolContext) -> Tool:
    from coa.tools.sandbox import SandboxLimits

    return code_tool(SandboxLimits(cpu_time_s=cfg.code_cpu_time_s, wall_time_s=cfg.code_wall_time_s,
                                   max_output_chars=cfg.max_observation_chars))


SPEC = ToolSpec(tag="code", domains=("math", "code"), body="```python ...```",
                does="runs a Python program; its output comes back in <observation>.", build=build, opaque=True)

"""The agents' tools: coa.tools.spec says what they are (tags, prompt lines, the code body), coa.tools.session
builds them from `common.tools` and runs them for a trajectory; a module per tool and per machine below it
(docs/design.md, "Adding a tool"). This file imports nothing, so describing the tools never loads them.
"""

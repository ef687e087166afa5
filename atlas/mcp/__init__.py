"""Atlas as a Model Context Protocol server (issue 22; docs/mcp.md).

Rooms by job:

- ``caller``: who a tool runs as (an API token's user) and the ``context``
  its writes record (``auth: "mcp"``, the MCP client's name);
- ``reads``: read tools answered by the API's own views, in process;
- ``plans``: the ``plan_token`` of a mutating tool's dry run;
- ``writes``: mutating tools over the write services, dry run unless confirmed;
- ``server``: assembles the tools and resources on the official SDK's ``FastMCP``:
  ``read_tools``, ``write_tools`` (the tools; their signatures are the input
  schemas), ``resources``, ``schema`` (argument help, output models) and
  ``bridge`` (a call's caller and thread, Atlas errors as tool errors);
- ``http``: ``/mcp``, the streamable HTTP transport behind a Django view.

``manage.py mcp`` serves the same server over stdio.
"""

"""A small MCP server for Fabric Runtime's examples and tests, on the official `mcp` package.

Run it over stdio (what a catalogue's `command:` starts):

    python examples/mcp/server.py

or over Streamable HTTP on a loopback port (a catalogue's `url: http://127.0.0.1:PORT/mcp`):

    python examples/mcp/server.py http PORT

Tools: `search` (a structured result), `lookup_order` (text), `fail` (always an error,
`isError`), `hang` (sleeps), `crash` (the process exits mid-call). With `MCP_CALLS_FILE` set,
each call appends one line `TOOL ARGUMENTS-AS-JSON` to that file, so a test can count calls.
"""

import json
import os
import sys

import anyio

from mcp.server import MCPServer
from pydantic import BaseModel
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("kb")

ARTICLES = [
    {"id": 7, "title": "Refunds for duplicate charges"},
    {"id": 12, "title": "Changing a delivery address"},
    {"id": 31, "title": "Cancelling an order"},
]


def record(tool: str, args: dict) -> None:
    path = os.environ.get("MCP_CALLS_FILE")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(f"{tool} {json.dumps(args, sort_keys=True)}\n")


class Hit(BaseModel):
    id: int
    title: str


class Hits(BaseModel):
    hits: list[Hit]


@server.tool()
def search(q: str, limit: int = 3) -> Hits:
    """Search the knowledge base; the hits whose title shares a word with the query."""
    record("search", {"q": q, "limit": limit})
    words = {w.lower() for w in q.split()}
    hits = [a for a in ARTICLES if words & {w.lower().rstrip("s") for w in a["title"].split()} or words & {w.lower() for w in a["title"].split()}]
    return Hits(hits=[Hit(**h) for h in hits[:limit]])


@server.tool(structured_output=False)
def lookup_order(order_id: str) -> str:
    """The status of an order, as text."""
    record("lookup_order", {"order_id": order_id})
    return f"Order {order_id} was refunded on 2026-11-30."


@server.tool()
def fail(reason: str) -> str:
    """Always fails (the result carries isError)."""
    record("fail", {"reason": reason})
    raise ToolError(f"cannot do that: {reason}")


@server.tool()
async def hang(seconds: float = 60.0) -> str:
    """Sleeps, then answers (a tool slower than its caller's timeout)."""
    record("hang", {"seconds": seconds})
    await anyio.sleep(seconds)
    return "woke up"


@server.tool()
def crash() -> str:
    """The server process exits in the middle of the call."""
    record("crash", {})
    os._exit(3)


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "http":
        server.run(transport="streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run()

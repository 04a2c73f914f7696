"""The log and status subscriptions over each websocket subprotocol, with gql's transport as mcli makes it
(tests/server/test_mcli_client.py); prints one JSON line. Arguments: a finished run's name, the API key."""

import asyncio
import json
import os
import sys

from gql import Client, gql
from gql.transport.exceptions import TransportQueryError
from gql.transport.websockets import WebsocketsTransport

LOGS = gql("subscription S($i: GetRunLogsInput!) { getRunLogsV2(getRunLogsInput: $i) { chunk endOffset } }")
STATUS = gql("subscription S($i: WatchRunStatusInput!) { watchRunStatus(watchRunStatusInput: $i) }")
URL = os.environ["MOSAICML_API_ENDPOINT"].replace("http://", "ws://")
name, key = sys.argv[1], sys.argv[2]


async def collect(session, query, variables, pick):
    return [pick(r) async for r in session.subscribe(query, variable_values=variables)]


async def protocol(proto):
    seen = {}
    chunk = lambda r: [r["getRunLogsV2"]["chunk"], r["getRunLogsV2"]["endOffset"]]  # noqa: E731
    transport = WebsocketsTransport(url=URL, init_payload={"Authorization": key}, subprotocols=[proto])
    async with Client(transport=transport) as session:
        seen["chunks"] = await collect(session, LOGS, {"i": {"name": name, "follow": False}}, chunk)
        seen["resumed"] = await collect(session, LOGS, {"i": {"name": name, "tail": 1}}, chunk)
        seen["status"] = await collect(session, STATUS, {"i": {"name": name}}, lambda r: r["watchRunStatus"])
        seen["subprotocol"] = transport.subprotocol
    refused = WebsocketsTransport(url=URL, init_payload={"Authorization": "tsk_not-a-key"}, subprotocols=[proto])
    async with Client(transport=refused) as session:
        try:
            await collect(session, STATUS, {"i": {"name": name}}, str)
        except TransportQueryError as exc:
            seen["bad_key"] = exc.errors
    return seen


out = {proto: asyncio.run(protocol(proto)) for proto in ("graphql-ws", "graphql-transport-ws")}
os.environ["MOSAICML_API_KEY"] = "tsk_not-a-key"
import mcli  # noqa: E402  (reads the key from the environment)

try:
    list(mcli.get_run_logs(name))
except Exception as exc:  # noqa: BLE001 - what the user sees
    out["mcli_bad_key"] = f"{type(exc).__name__}: {exc}"
print(json.dumps(out))

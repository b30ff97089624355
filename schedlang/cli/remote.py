"""The commands on remote devices (TVM RPC): rpc-status, rpc-server."""

from __future__ import annotations

from typing import Annotated

import typer

from schedlang.cli.app import command


@command("rpc-status")
def rpc_status_command(
    rpc_tracker: Annotated[str, typer.Option("--rpc-tracker", help="The tracker: HOST:PORT.")],
) -> None:
    """The devices registered with a TVM RPC tracker: per key, how many, free, requests waiting."""
    from schedlang.run.remote import TrackerClient, parse_tracker, render_summary

    address = parse_tracker(rpc_tracker)
    with TrackerClient(address) as tracker:
        typer.echo(render_summary(address, tracker.summary()))


@command("rpc-server")
def rpc_server_command(
    rpc_tracker: Annotated[str, typer.Option("--rpc-tracker", help="The tracker: HOST:PORT.")],
    rpc_key: Annotated[str, typer.Option("--rpc-key", help="The key to register under.")],
    host: Annotated[
        str, typer.Option("--host", help="Address to listen on; 0.0.0.0 exposes it to the network.")
    ] = "127.0.0.1",
    port: Annotated[
        int, typer.Option("--port", min=1, max=65535, help="First port to try.")
    ] = 9090,
    port_end: Annotated[
        int, typer.Option("--port-end", min=1, max=65535, help="Last port to try.")
    ] = 9199,
) -> None:
    """Serve this machine to a tracker as a device (TVM's RPC server, outliving crashing
    kernels) until interrupted. Anyone who reaches it can run code here: trusted networks only."""
    # A server never sees a torch tensor; tvm_ffi imports torch (seconds) whenever it can.
    from schedlang.core.imports import defer_torch

    defer_torch()
    from schedlang.run.remote import parse_tracker, serve

    serve(
        parse_tracker(rpc_tracker),
        rpc_key,
        host,
        port,
        port_end,
        on_start=lambda text: typer.echo(text, err=True),
    )

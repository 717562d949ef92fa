"""The simulator's control surface for tests: /_sim/faults, /_sim/stats,
/_sim/reset."""
from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from app.simulator.engine import Simulator
from app.simulator.faults import FaultError, Faults, parse_faults
from app.simulator.wire import BadBody, read_json


async def get_faults(request: Request) -> Response:
    sim: Simulator = request.app.state.sim
    return JSONResponse(sim.store.faults.as_dict())


async def set_faults(request: Request) -> Response:
    sim: Simulator = request.app.state.sim
    try:
        faults = parse_faults(await read_json(request))
    except (BadBody, FaultError) as exc:
        return JSONResponse({"error": str(exc)}, status_code=400)
    sim.store.faults = faults
    return JSONResponse(faults.as_dict())


async def clear_faults(request: Request) -> Response:
    sim: Simulator = request.app.state.sim
    sim.store.faults = Faults()
    return JSONResponse(sim.store.faults.as_dict())


async def get_stats(request: Request) -> Response:
    sim: Simulator = request.app.state.sim
    return JSONResponse(sim.store.stats.as_dict())


async def reset(request: Request) -> Response:
    """Forget every task, counter, fault and pending webhook."""
    sim: Simulator = request.app.state.sim
    sim.reset()
    return JSONResponse(sim.store.stats.as_dict())


routes = [
    Route("/_sim/faults", get_faults, methods=["GET"]),
    Route("/_sim/faults", set_faults, methods=["POST"]),
    Route("/_sim/faults", clear_faults, methods=["DELETE"]),
    Route("/_sim/stats", get_stats, methods=["GET"]),
    Route("/_sim/stats", reset, methods=["DELETE"]),
    Route("/_sim/reset", reset, methods=["POST"]),
]

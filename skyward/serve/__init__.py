"""Serving: an ASGI app behind an HTTP endpoint, run as replicas on a pool's nodes.

* ``router``: the endpoint itself, on the client machine: admits a request by its bearer token,
  sends it to the ready replica with the fewest outstanding requests, streams both ways, fails
  over what it can when a replica is lost, and queues (bounded) when every replica is busy.
* ``replica``: what runs on a node: the app under uvicorn on a Unix socket of the node, started
  as a streaming task of the pool (so the pool's membership, healing and plugins apply to it).
* ``head`` / ``headlink``: ``on="head"``: the router as a task on the pool's head node, on its
  private address, and the endpoint's hold on it (a control socket, and the task's beats).
* ``endpoint``: ``pool.serve(app)``: starts a replica on each node as it joins, hands ready ones
  to the router, and takes lost ones out.
"""

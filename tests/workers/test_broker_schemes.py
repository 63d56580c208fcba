"""Every broker Lanes takes runs its transport, taking and recording in one step (lanes/broker.py).

``rediss://`` (TLS) and ``sentinel://`` brokers ran kombu's own transport,
where a consumer killed between its BRPOP and its unacked record lost the
message. Real parts: a private redis-server speaking only TLS, a private
primary watched by a private Sentinel, the Celery app Lanes configures, and a
consumer process SIGKILLed in that instant.
"""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import sys
import time

import pytest
import redis
from kombu import Connection, Consumer, Queue

from lanes.broker import (TAKE, SentinelTransport, Transport, held_tags, refresh_held, restore_stale,
                          takes_atomically)
from lanes.celery_client import broker_client, broker_queued, celery_config, make_celery
from lanes.sentinel import parse
from lanes.embedded import free_port
from lanes.settings import mask_url
from tests.conftest import SENTINEL_MASTER, _machine_redis_server, _private_server
from tests.workers.test_atomic_receive import KILLED_ON_RECEIPT, QUEUE, publish, receive
from workers.handback import finish_pending_brpop

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(params=["rediss-CERT_REQUIRED", "rediss-required", "sentinel"])
def broker(request):
    """(LANES_BROKER_URL, client of the broker's Redis, the transport Lanes picks for it)."""
    if request.param.startswith("rediss"):
        port, ca, client = request.getfixturevalue("tls_redis")
        spelling = request.param.split("-", 1)[1]
        return f"rediss://127.0.0.1:{port}/0?ssl_cert_reqs={spelling}&ssl_ca_certs={ca}", client, Transport
    url, primary = request.getfixturevalue("sentinel_redis")
    return url, primary, SentinelTransport


def kombu_connection(config: dict, **options) -> Connection:
    """A kombu connection exactly as the Celery app of ``config`` makes it."""
    return Connection(config["broker_url"], transport=config.get("broker_transport"),
                      transport_options={**config["broker_transport_options"], **options})


def test_each_broker_runs_the_lanes_transport_and_records_until_acked(broker, one_redis_url, make_settings):
    url, client, transport = broker
    settings = make_settings(redis_url=one_redis_url, broker_url=url)
    app = make_celery(settings, one_redis_url)
    try:
        with app.connection_for_write() as conn:
            assert type(conn.transport) is transport
            channel = conn.default_channel
            assert takes_atomically(channel)
            app.send_task("lanes.test.noop", args=[1], queue=QUEUE, connection=conn)
            publish(conn, {"n": 2})
            # What lanes' own clients of the broker read (metrics, the lanes page).
            assert client.llen(QUEUE) == 2

            held = receive(conn, [QUEUE], 2, ack=False)
            assert len(held) == 2 and held[1] == {"n": 2}
            assert client.hlen("unacked") == 2 and client.zcard("unacked_index") == 2
            assert client.xlen(f"{QUEUE}:bell") == 1
            # HeldMessages' refresh: a live holder moves its records forward.
            later = time.time() + 100
            assert refresh_held(channel, held_tags([channel]), later) == 2
            assert {score for _, score in client.zrange("unacked_index", 0, -1, withscores=True)} == {later}
            channel.qos.restore_unacked()
            assert receive(conn, [QUEUE], 2) and client.hlen("unacked") == 0
    finally:
        app.close()
    # Lanes' own client of the broker (queue lengths for metrics and the lanes page).
    assert set(broker_queued(broker_client(settings, None), "nofleet").values()) == {0}


def test_celerys_broker_use_ssl_spelling_reaches_the_lanes_transport(tls_redis, one_redis_url, make_settings):
    port, ca, client = tls_redis
    app = make_celery(make_settings(redis_url=one_redis_url), one_redis_url)
    # Celery's own spelling: a bare rediss:// URL, the TLS options beside it.
    app.conf.broker_url = f"rediss://127.0.0.1:{port}/0"
    app.conf.broker_transport = "lanes.broker:Transport"
    app.conf.broker_use_ssl = {"ssl_cert_reqs": ssl.CERT_REQUIRED, "ssl_ca_certs": str(ca)}
    try:
        with app.connection_for_write() as conn:
            assert isinstance(conn.transport, Transport)
            publish(conn, {"n": 1})
            assert receive(conn, [QUEUE], 1) == [{"n": 1}]
            assert client.hlen("unacked") == 0 and client.llen(QUEUE) == 0
    finally:
        app.close()


def test_a_take_pending_at_shutdown_is_read_and_its_message_put_back(broker, one_redis_url, make_settings):
    """workers/handback.py's StopTaking on each broker: the reply of the take a stopping
    worker sent is read, and the message it took goes back to its queue, unrecorded."""
    url, client, _ = broker
    config = celery_config(make_settings(redis_url=one_redis_url, broker_url=url), one_redis_url)
    client.script_load(TAKE)  # as a running deployment has it (a first take would be refused NOSCRIPT)
    with kombu_connection(config) as connection:
        publish(connection, {"n": "handed back"})
        channel = connection.channel()
        channel.basic_consume(QUEUE, False, lambda message: None, "stopping")
        connection.transport.cycle._register_BRPOP(channel)  # what the worker's loop does: sends the take
        channel.basic_cancel("stopping")  # StopTaking cancels the consumer...
        deadline = time.monotonic() + 10
        while client.llen(QUEUE):  # ...after the take moved the message into the record
            assert time.monotonic() < deadline, "the take took nothing"
            time.sleep(0.02)
        assert client.hlen("unacked") == 1
        finish_pending_brpop(channel)
        assert not channel._in_poll
    assert client.llen(QUEUE) == 1 and client.hlen("unacked") == 0


def _kill_on_receipt(config: dict, client) -> None:
    """Run a consumer of ``config``'s broker that is SIGKILLed as it receives one published message."""
    options = {key: config["broker_transport_options"][key] for key in ("master_name",)
               if key in config["broker_transport_options"]}
    transport = config.get("broker_transport") or ("sentinel" if options else "rediss")
    child = subprocess.Popen([sys.executable, "-c", KILLED_ON_RECEIPT, config["broker_url"], transport, QUEUE,
                              json.dumps(options)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "waiting"
        time.sleep(0.3)  # its wait (or kombu's BRPOP) is sent
        with kombu_connection(config) as connection:
            publish(connection, {"n": "the one"})
        assert child.wait(30) == -9  # killed on receipt: the message had left its queue
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert client.llen(QUEUE) == 0


def test_a_consumer_killed_on_receipt_loses_nothing_on_any_broker(broker, one_redis_url, make_settings):
    url, client, _ = broker
    config = celery_config(make_settings(redis_url=one_redis_url, broker_url=url), one_redis_url)
    _kill_on_receipt(config, client)
    assert client.hlen("unacked") == 1  # recorded as held, by a consumer that no longer refreshes it

    with kombu_connection(config) as connection:
        # A live worker gives back what its holder stopped refreshing (HeldMessages' sweep).
        assert restore_stale(connection.default_channel, 0.0, time.time() + 1) == 1
        assert receive(connection, [QUEUE], 1) == [{"n": "the one"}]
    assert client.hlen("unacked") == 0 and client.zcard("unacked_index") == 0


@pytest.mark.parametrize("scheme", ["rediss", "sentinel"])
def test_kombus_own_transport_lost_that_message(scheme, request, one_redis_url, make_settings):
    """What the test above guards against: these brokers' transport before (kombu's)."""
    if scheme == "rediss":
        port, ca, client = request.getfixturevalue("tls_redis")
        url = f"rediss://127.0.0.1:{port}/0?ssl_cert_reqs=required&ssl_ca_certs={ca}"
    else:
        url, client = request.getfixturevalue("sentinel_redis")
    config = celery_config(make_settings(redis_url=one_redis_url, broker_url=url), one_redis_url,
                           kombu_transport=True)
    assert "broker_transport" not in config
    _kill_on_receipt(config, client)
    assert client.hlen("unacked") == 0  # popped, never recorded: nothing can give it back


def test_a_sentinel_url_is_split_into_what_kombu_reads_and_its_primarys_name():
    url = "sentinel://:pw1@s1:26380/2;sentinel://:pw2@s2?master_name=broker"
    parsed = parse(url)
    assert parsed.sentinels == (("s1", 26380), ("s2", 26379))
    assert (parsed.master_name, parsed.db, parsed.password) == ("broker", 2, "pw1")
    assert parsed.kombu_url == "sentinel://:pw1@s1:26380/2;sentinel://:pw2@s2"
    shown = mask_url(url)
    assert "pw1" not in shown and "pw2" not in shown and shown.count("***") == 2


@pytest.fixture
def sentinel_with_replica(tmp_path):
    """(broker URL, sentinel client, primary port, replica port) of a primary, its
    replica and a Sentinel watching both, private to the test."""
    binary = _machine_redis_server()
    folder = tmp_path / "failover"
    folder.mkdir()
    primary_port, replica_port, sentinel_port = free_port(), free_port(), free_port()
    primary = redis.Redis(port=primary_port, socket_timeout=5)
    replica = redis.Redis(port=replica_port, socket_timeout=5)
    base = ["--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(folder)]
    processes = [
        _private_server([binary, "--port", str(primary_port), *base], folder, primary.ping),
        _private_server([binary, "--port", str(replica_port), *base, "--replicaof", "127.0.0.1", str(primary_port)],
                        folder, lambda: replica.info("replication")["master_link_status"] == "up"),
    ]
    conf = folder / "sentinel.conf"
    conf.write_text(f"port {sentinel_port}\nbind 127.0.0.1\ndir {folder}\n"
                    f"sentinel monitor {SENTINEL_MASTER} 127.0.0.1 {primary_port} 1\n"
                    f"sentinel down-after-milliseconds {SENTINEL_MASTER} 2000\n"
                    f"sentinel failover-timeout {SENTINEL_MASTER} 10000\n")
    asker = redis.Redis(port=sentinel_port, socket_timeout=5)
    processes.append(_private_server([binary, str(conf), "--sentinel"], folder,
                                     lambda: bool(asker.sentinel_slaves(SENTINEL_MASTER))))
    yield f"sentinel://127.0.0.1:{sentinel_port}/0?master_name={SENTINEL_MASTER}", asker, primary_port, replica_port
    for process in reversed(processes):
        process.terminate()
        process.wait(30)
    for client in (asker, primary, replica):
        client.close()


@pytest.mark.slow
def test_a_message_held_across_a_sentinel_failover_is_still_recorded_and_the_consumer_follows(
        sentinel_with_replica, one_redis_url, make_settings):
    url, sentinel, old_port, new_port = sentinel_with_replica
    config = celery_config(make_settings(redis_url=one_redis_url, broker_url=url), one_redis_url)
    old, new = redis.Redis(port=old_port, socket_timeout=5), redis.Redis(port=new_port, socket_timeout=5)
    received: list = []
    with kombu_connection(config) as connection, kombu_connection(config) as producer:
        def publish_retrying(body: dict) -> None:
            producer.ensure(producer, lambda: publish(producer, body), max_retries=30, interval_max=1)()

        with Consumer(connection, queues=[Queue(QUEUE)], accept=["json"],
                      callbacks=[lambda body, message: received.append(body)]):  # held, never acked
            publish_retrying({"n": "held"})
            while not received:
                connection.drain_events(timeout=10)
            assert old.hlen("unacked") == 1
            assert old.wait(1, 5000) == 1  # the record reached the replica

            deadline = time.monotonic() + 30
            while True:  # NOGOODSLAVE until the Sentinel has the replica's first INFO
                try:
                    assert sentinel.execute_command("SENTINEL", "FAILOVER", SENTINEL_MASTER) == b"OK"
                    break
                except redis.ResponseError as refused:
                    assert "NOGOODSLAVE" in str(refused) and time.monotonic() < deadline, refused
                    time.sleep(0.2)
            while int(sentinel.sentinel_get_master_addr_by_name(SENTINEL_MASTER)[1]) != new_port:
                assert time.monotonic() < deadline, "no failover"
                time.sleep(0.1)
            assert new.hlen("unacked") == 1  # the held message's record moved with the data
            # Until the Sentinel demotes the old primary, a client still connected
            # to it writes there, and the demotion drops those writes (the window
            # docs/OPERATING.md names): publish once it refuses them (the Sentinel
            # reconfigures it on its next INFO of it, every 10 s).
            deadline = time.monotonic() + 60
            while old.role()[0] != b"slave":
                assert time.monotonic() < deadline, "the old primary was not demoted"
                time.sleep(0.1)

            publish_retrying({"n": "after"})
            deadline = time.monotonic() + 60
            while len(received) < 2:
                assert time.monotonic() < deadline, f"the consumer did not follow the failover: {received}"
                try:
                    connection.drain_events(timeout=1)
                except TimeoutError:
                    pass
                except connection.connection_errors:  # the old primary, now a replica, refused the take
                    connection.ensure_connection(max_retries=30)
            assert received == [{"n": "held"}, {"n": "after"}]
            assert new.hlen("unacked") == 2 and new.llen(QUEUE) == 0  # both held, on the new primary
    # Closed, the consumer put back what its live channel held; the first
    # channel's record waits for a live worker's sweep: each message is somewhere.
    assert new.hlen("unacked") + new.llen(QUEUE) == 2
    old.close()
    new.close()


def test_redis_status_checks_the_primary_a_sentinel_broker_url_names(sentinel_redis, one_redis_url, tmp_path):
    url, primary = sentinel_redis
    primary.config_set("appendonly", "yes")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LANES_")}
    env.update(LANES_STATE_DIR=str(tmp_path / "state"), HOME=str(tmp_path), LANES_REDIS_URL=one_redis_url,
               LANES_BROKER_URL=url.replace("sentinel://", "sentinel://:secret@", 1))
    done = subprocess.run([sys.executable, "-m", "lanes.cli", "redis", "status"], env=env, capture_output=True,
                          text=True, timeout=120)
    broker = [line for line in done.stdout.splitlines() if line.startswith("broker:")]
    assert broker and "redis 7" in broker[0] and "master_name=lanes-test" in broker[0], done.stdout + done.stderr
    assert "secret" not in done.stdout + done.stderr

"""A single-node KRaft Apache Kafka broker on free loopback ports, from the Maven Central jars.

with KafkaBroker() as broker:
    print(broker.bootstrap)          # "127.0.0.1:PORT"
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from infra import paths
from infra.local.process import LocalService, ServiceProcess, free_port, port_open, tail
from schemas.errors import ServiceError

_LOG4J2 = """\
status = warn
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = file
logger.kafka.name = kafka
logger.kafka.level = WARN
logger.apache.name = org.apache.kafka
logger.apache.level = WARN
"""


def _server_properties(data_dir: Path, host: str, port: int, controller_port: int) -> str:
    props = {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.voters": f"1@127.0.0.1:{controller_port}",
        "listeners": f"PLAINTEXT://{host}:{port},CONTROLLER://127.0.0.1:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://{host}:{port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "log.dirs": str(data_dir / "log"),
        "num.partitions": "1",
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "4",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        "min.insync.replicas": "1",
        "group.initial.rebalance.delay.ms": "0",
        "auto.create.topics.enable": "true",
        "message.max.bytes": str(16 * 1024 * 1024),
    }
    return "".join(f"{k}={v}\n" for k, v in props.items())


class KafkaBroker(LocalService):
    """Start (``__enter__``) and stop (``__exit__``) a throwaway single-node broker.

    Args:
        data_dir: where the broker keeps its log segments; a fresh temporary dir by default
            (removed on stop). A given dir is kept, and reused if it is already formatted.
        heap: the JVM's maximum heap.
        ready_timeout: seconds to wait for the listener before failing with the log's tail.
        port: the client listener's port (default: a free one).
        host: the client listener's address, which clients are told to use too (default
            loopback; a real node's gateway for pods to reach it as well as this machine).
    """

    description = "Kafka broker"

    def __init__(
        self,
        data_dir: Path | None = None,
        heap: str = "512m",
        ready_timeout: float = 90.0,
        port: int | None = None,
        host: str = "127.0.0.1",
    ) -> None:
        self._own_dir = data_dir is None
        self.data_dir = (
            Path(tempfile.mkdtemp(prefix="openforge-kafka-")) if data_dir is None else data_dir
        )
        self.host = host
        self.port = port or free_port()
        self.controller_port = free_port()
        self.heap = heap
        self.ready_timeout = ready_timeout
        self.log_path = self.data_dir / "broker.log"
        self._process: ServiceProcess | None = None

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        return f"kafka://{self.bootstrap}"

    def _java(self) -> list[str]:
        java = shutil.which("java")
        if java is None:
            raise ServiceError(
                "java not found on PATH: install Java 17+ (scripts/setup checks it)."
            )
        return [
            java,
            f"-Xmx{self.heap}",
            "-Xms64m",
            "-XX:+UseSerialGC",
            "-cp",
            f"{paths.kafka_libs()}/*",
        ]

    def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        props = self.data_dir / "server.properties"
        props.write_text(
            _server_properties(self.data_dir, self.host, self.port, self.controller_port)
        )
        log4j = self.data_dir / "log4j2.properties"
        log4j.write_text(_LOG4J2.format(log=self.log_path))
        java = self._java()
        env = dict(os.environ)
        env["KAFKA_LOG4J_OPTS"] = f"-Dlog4j2.configurationFile={log4j}"
        jvm_log = [f"-Dlog4j2.configurationFile={log4j}"]
        if not (self.data_dir / "log" / "meta.properties").exists():
            cluster_id = (
                subprocess.run(
                    [*java, "kafka.tools.StorageTool", "random-uuid"],
                    check=True,
                    capture_output=True,
                    text=True,
                )
                .stdout.strip()
                .splitlines()[-1]
            )
            fmt = subprocess.run(
                [
                    *java,
                    *jvm_log,
                    "kafka.tools.StorageTool",
                    "format",
                    "-t",
                    cluster_id,
                    "-c",
                    str(props),
                    "--ignore-formatted",
                ],
                capture_output=True,
                text=True,
            )
            if fmt.returncode != 0:
                raise ServiceError(f"kafka storage format failed:\n{fmt.stdout}\n{fmt.stderr}")
        self._process = ServiceProcess(
            "kafka",
            [*java[:1], *java[1:], *jvm_log, "kafka.Kafka", str(props)],
            log_path=self.data_dir / "broker.stdout.log",
            env=env,
        )
        self._process.start()
        try:
            self._process.wait_ready(
                lambda: port_open(self.port, self.host), timeout=self.ready_timeout
            )
        except ServiceError as exc:
            raise ServiceError(f"{exc}\nBroker log:\n{tail(self.log_path)}") from exc

    def stop(self) -> None:
        if self._process is not None:
            self._process.stop()
            self._process = None
        if self._own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

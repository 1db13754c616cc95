"""The local runtime of `gpumeter up`: a KRaft Kafka broker from Maven jars, the chdb ClickHouse
server, pid files and logs under data_dir, and child-process helpers."""

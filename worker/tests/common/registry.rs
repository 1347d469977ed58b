//! A job reading Avro, JSON Schema or Protobuf through the test services' schema registry, its records written by
//! confluent-kafka's AvroSerializer, JSONSerializer or ProtobufSerializer (test-support/producers/confluent_avro.py,
//! confluent_json.py, confluent_protobuf.py).

use serde_json::{Value, json};
use test_support::Services;

use super::Job;

/// An `Order` record schema: `id` (long) and `note` (optional string), then `extra` fields (optional, default
/// null), each `(name, avro type)`.
pub fn order_schema(extra: &[(&str, &str)]) -> String {
    let mut fields = vec![
        json!({"name": "id", "type": "long"}),
        json!({"name": "note", "type": ["null", "string"], "default": null}),
    ];
    fields.extend(
        extra
            .iter()
            .map(|(name, kind)| json!({"name": name, "type": ["null", kind], "default": null})),
    );
    json!({"type": "record", "name": "Order", "namespace": "ratchet.test", "fields": fields})
        .to_string()
}

impl Job {
    /// Reads the source as Avro through the registry (`[source.registry]` with the test credentials; the reader
    /// schema is the subject's latest version when the process starts).
    pub fn read_registry_avro(&self) {
        let registry = Services::get().registry();
        self.edit_config(
            r#"decoding = { kind = "json", fields = [ { name = "id", type = "int64", nullable = false } ] }"#,
            r#"decoding = { kind = "avro" }"#,
        );
        let text = std::fs::read_to_string(&self.config).unwrap();
        std::fs::write(
            &self.config,
            format!(
                "{text}\n[source.registry]\nurl = \"{}/\"\nusername = \"{}\"\npassword = \"{}\"\n",
                registry.url, registry.user, registry.password
            ),
        )
        .unwrap();
    }

    /// Reads the source as JSON Schema through the registry (`decoding = { kind = "json-schema" }` and
    /// `[source.registry]`; the columns are the subject's latest schema's properties when the process starts).
    pub fn read_registry_json_schema(&self) {
        self.read_registry_avro();
        self.set_decoding(r#"{ kind = "json-schema" }"#);
    }

    /// Reads the source as Protobuf through the registry (`decoding = { kind = "protobuf" }` and
    /// `[source.registry]`; the columns are the first message of the subject's latest schema when the process
    /// starts).
    pub fn read_registry_protobuf(&self) {
        self.read_registry_avro();
        self.set_decoding(r#"{ kind = "protobuf" }"#);
    }

    /// Writes `records` (JSON objects in Protobuf's JSON mapping) as messages `message` of the `.proto` text
    /// `proto` through confluent-kafka's ProtobufSerializer; `imports` are the files (name, text) it imports,
    /// registered as references. Returns the schema id the values carry.
    pub fn produce_protobuf(
        &self,
        proto: &str,
        message: &str,
        records: &[Value],
        imports: &[(&str, &str)],
    ) -> u64 {
        self.protobuf_producer(proto, message, records, imports, None, None)
    }

    /// As [`produce_protobuf`](Self::produce_protobuf), the subject's compatibility set to `compatibility` first
    /// (`NONE`: a change Apicurio's BACKWARD rule refuses, such as `int32` to `int64`).
    pub fn produce_protobuf_with_compatibility(
        &self,
        proto: &str,
        message: &str,
        records: &[Value],
        compatibility: &str,
    ) -> u64 {
        self.protobuf_producer(proto, message, records, &[], None, Some(compatibility))
    }

    /// As [`produce_protobuf`](Self::produce_protobuf), each record keyed by a `key_message` (of the same file)
    /// holding its `id`, written by a ProtobufSerializer for keys (subject `<topic>-key`).
    pub fn produce_protobuf_keyed(
        &self,
        proto: &str,
        message: &str,
        key_message: &str,
        records: &[Value],
    ) -> u64 {
        self.protobuf_producer(proto, message, records, &[], Some(key_message), None)
    }

    fn protobuf_producer(
        &self,
        proto: &str,
        message: &str,
        records: &[Value],
        imports: &[(&str, &str)],
        key_message: Option<&str>,
        compatibility: Option<&str>,
    ) -> u64 {
        let services = Services::get();
        let records = Value::from(records.to_vec()).to_string();
        let imports: serde_json::Map<String, Value> = imports
            .iter()
            .map(|(name, text)| (name.to_string(), Value::from(*text)))
            .collect();
        let imports = Value::Object(imports).to_string();
        let mut args = vec![
            services.kafka_bootstrap(),
            &self.topic,
            proto,
            message,
            &records,
            &imports,
        ];
        args.extend(key_message);
        let flag = compatibility.map(|level| format!("--compatibility={level}"));
        args.extend(flag.as_deref());
        services.produce("confluent_protobuf.py", &args)["schema_id"]
            .as_u64()
            .unwrap()
    }

    /// Writes `records` (JSON objects) with JSON Schema `schema` through confluent-kafka's JSONSerializer, which
    /// validates each one; with `validate = false` they are framed with the schema's id unvalidated, as a producer
    /// that skips validation writes them. Returns the schema id the values carry.
    pub fn produce_json_schema(&self, schema: &str, records: &[Value], validate: bool) -> u64 {
        let services = Services::get();
        let records = Value::from(records.to_vec()).to_string();
        let mut args = vec![services.kafka_bootstrap(), &self.topic, schema, &records];
        if !validate {
            args.push("--no-validate");
        }
        services.produce("confluent_json.py", &args)["schema_id"]
            .as_u64()
            .unwrap()
    }

    /// Sets `evolution = "add-columns"` on every sink.
    pub fn evolve_every_sink(&self) {
        self.set_every_sink_evolution("add-columns");
    }

    /// Sets `evolution = "<mode>"` on every sink.
    pub fn set_every_sink_evolution(&self, mode: &str) {
        let text = std::fs::read_to_string(&self.config).unwrap();
        std::fs::write(
            &self.config,
            text.replace(
                "[[sinks]]\n",
                &format!("[[sinks]]\nevolution = \"{mode}\"\n"),
            ),
        )
        .unwrap();
    }

    /// Sets `evolution = "ignore"` on the table sinks (JDBC, Iceberg) of a job whose sinks all have
    /// `add-columns` ([`Job::evolve_every_sink`]): the file and Kafka sinks keep taking new fields.
    pub fn ignore_in_tables(&self) {
        for kind in ["jdbc", "iceberg"] {
            let text = std::fs::read_to_string(&self.config).unwrap().replace(
                &format!("evolution = \"add-columns\"\ntype = \"{kind}\""),
                &format!("evolution = \"ignore\"\ntype = \"{kind}\""),
            );
            std::fs::write(&self.config, text).unwrap();
        }
    }

    /// Registers Avro `schema` under `<topic>-value` without producing a record of it (a writer's new version that
    /// a process starting now reads with).
    pub async fn register_value_schema(&self, schema: &str) {
        let endpoint = Services::get().registry();
        let registry = schema_registry::SchemaRegistry::new(&schema_registry::RegistrySettings {
            username: Some(endpoint.user.clone()),
            password: Some(endpoint.password.clone().into()),
            ..schema_registry::RegistrySettings::new(&endpoint.url)
        })
        .unwrap();
        registry
            .register(&format!("{}-value", self.topic), schema)
            .await
            .unwrap();
    }

    /// Produces the next `count` ids with `schema` (AvroSerializer, registered under `<topic>-value`), each record
    /// `{"id": n, "note": "n<n>"}` with the fields `extra(n)` returns (a JSON object) added.
    pub fn produce_avro(&mut self, schema: &str, count: u64, extra: impl Fn(u64) -> Value) {
        let records: Vec<Value> = (self.produced..self.produced + count)
            .map(|id| {
                let mut record = json!({"id": id, "note": format!("n{id}")});
                if let (Some(record), Value::Object(extra)) = (record.as_object_mut(), extra(id)) {
                    record.extend(extra);
                }
                record
            })
            .collect();
        let services = Services::get();
        services.produce(
            "confluent_avro.py",
            &[
                services.kafka_bootstrap(),
                &self.topic,
                schema,
                &Value::from(records).to_string(),
            ],
        );
        self.produced += count;
    }
}

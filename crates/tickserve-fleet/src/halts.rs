//! Halts for the whole fleet: one key per halted version
//! (`P/halts/MODEL/VERSION`, the halt's JSON as its value), not leased (a
//! halt outlives every replica), followed by every replica.

use etcd_client::PutOptions;
use tickserve_core::fleet::HaltRecord;

use crate::Fleet;
use crate::follow::Change;

impl Fleet {
    pub(crate) async fn write_halt(&self, record: HaltRecord) -> Result<(), String> {
        let key = self.keys.halt(&record.model, &record.version);
        self.clients
            .kv(|mut kv| {
                let (key, halt) = (key.clone(), record.halt.clone());
                async move {
                    match halt {
                        Some(halt) => kv.put(key, halt, None::<PutOptions>).await.map(drop),
                        None => kv.delete(key, None).await.map(drop),
                    }
                }
            })
            .await
    }
}

/// A change of `P/halts/` as halt records (`true`: they replace every halt
/// known so far).
pub(crate) fn records(keys: &crate::keys::Keys, change: Change) -> (Vec<HaltRecord>, bool) {
    let record = |key: &[u8], halt: Option<Vec<u8>>| {
        keys.split("halts", key).map(|(model, version)| HaltRecord {
            model,
            version,
            halt,
        })
    };
    match change {
        Change::Reset(all) => (
            all.into_iter()
                .filter_map(|(k, v)| record(&k, Some(v)))
                .collect(),
            true,
        ),
        Change::Put(key, value) => (record(&key, Some(value)).into_iter().collect(), false),
        Change::Delete(key) => (record(&key, None).into_iter().collect(), false),
    }
}

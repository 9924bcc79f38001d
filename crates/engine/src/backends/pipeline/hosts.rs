//! MLX's ring hostfile: a JSON list with one entry per rank, each a list of `"ip:port"` strings
//! (`[["127.0.0.1:5000"], ["127.0.0.1:5001"]]`), read and checked here so that a bad file or
//! rank is refused with a message naming it, before MLX reads the same file.

use std::path::Path;

use crate::error::EngineError;

/// The addresses of every rank, in rank order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Hostfile {
    pub(crate) ranks: Vec<Vec<String>>,
}

fn refuse(message: String) -> EngineError {
    EngineError::backend("mlx", format!("pipeline: {message}"))
}

impl Hostfile {
    /// Reads and checks `path` for a pipeline in which this process is `rank`.
    pub(crate) fn read(path: &Path, rank: usize) -> Result<Hostfile, EngineError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| refuse(format!("cannot read the hostfile {}: {e}", path.display())))?;
        let hosts =
            Self::parse(&text).map_err(|e| refuse(format!("hostfile {}: {e}", path.display())))?;
        if rank >= hosts.ranks.len() {
            return Err(refuse(format!(
                "rank {rank} is out of range: the hostfile {} lists {} ranks (0 to {})",
                path.display(),
                hosts.ranks.len(),
                hosts.ranks.len() - 1
            )));
        }
        Ok(hosts)
    }

    /// Parses a hostfile's text: at least two ranks, each with at least one `host:port`.
    pub(crate) fn parse(text: &str) -> Result<Hostfile, String> {
        let value: serde_json::Value = serde_json::from_str(text).map_err(|e| {
            format!("not JSON ({e}); expected a list of ranks, e.g. [[\"127.0.0.1:5000\"], [\"127.0.0.1:5001\"]]")
        })?;
        let list = value
            .as_array()
            .ok_or("expected a JSON list with one entry per rank")?;
        if list.len() < 2 {
            return Err(format!(
                "{} rank(s): a pipeline needs at least two (one process runs the whole model \
                 without --pipeline)",
                list.len()
            ));
        }
        let mut ranks = Vec::with_capacity(list.len());
        for (rank, entry) in list.iter().enumerate() {
            let addresses = entry.as_array().ok_or_else(|| {
                format!("rank {rank}'s entry is not a list of \"ip:port\" strings")
            })?;
            if addresses.is_empty() {
                return Err(format!("rank {rank} has no address"));
            }
            let mut parsed = Vec::with_capacity(addresses.len());
            for address in addresses {
                let text = address.as_str().ok_or_else(|| {
                    format!("rank {rank}: {address} is not an \"ip:port\" string")
                })?;
                let port = text
                    .rsplit_once(':')
                    .filter(|(host, _)| !host.is_empty())
                    .and_then(|(_, port)| port.parse::<u16>().ok());
                if port.is_none_or(|p| p == 0) {
                    return Err(format!(
                        "rank {rank}: {text:?} is not \"ip:port\" with a port from 1 to 65535"
                    ));
                }
                parsed.push(text.to_owned());
            }
            ranks.push(parsed);
        }
        Ok(Hostfile { ranks })
    }

    /// `rank`'s addresses, comma-separated, for messages.
    pub(crate) fn describe(&self, rank: usize) -> String {
        self.ranks
            .get(rank)
            .map(|a| a.join(", "))
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_mlx_ring_hostfiles_and_refuses_bad_ones() {
        let ok =
            Hostfile::parse(r#"[["127.0.0.1:5000"], ["10.0.0.2:5001", "10.0.1.2:5001"]]"#).unwrap();
        assert_eq!(ok.ranks.len(), 2);
        assert_eq!(ok.describe(1), "10.0.0.2:5001, 10.0.1.2:5001");
        for (text, says) in [
            ("[[\"127.0.0.1:5000\"]", "not JSON"),
            ("{}", "one entry per rank"),
            ("[[\"127.0.0.1:5000\"]]", "at least two"),
            ("[[\"127.0.0.1:5000\"], []]", "rank 1 has no address"),
            (
                "[[\"127.0.0.1\"], [\"127.0.0.1:1\"]]",
                "rank 0: \"127.0.0.1\"",
            ),
            ("[[\"127.0.0.1:0\"], [\"127.0.0.1:1\"]]", "port from 1"),
            ("[[\"a:99999\"], [\"127.0.0.1:1\"]]", "port from 1"),
            ("[[5000], [\"127.0.0.1:1\"]]", "rank 0: 5000"),
            ("[\"127.0.0.1:1\", \"127.0.0.1:2\"]", "rank 0's entry"),
        ] {
            let err = Hostfile::parse(text).unwrap_err();
            assert!(err.contains(says), "{text}: {err}");
        }
    }

    #[test]
    fn a_rank_past_the_hostfile_is_refused_by_number() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hosts.json");
        std::fs::write(&path, r#"[["127.0.0.1:5000"], ["127.0.0.1:5001"]]"#).unwrap();
        let err = Hostfile::read(&path, 2).unwrap_err().to_string();
        assert!(err.contains("rank 2 is out of range"), "{err}");
        assert!(err.contains("lists 2 ranks"), "{err}");
        assert!(Hostfile::read(&path, 1).is_ok());
        let err = Hostfile::read(&dir.path().join("none.json"), 0)
            .unwrap_err()
            .to_string();
        assert!(err.contains("cannot read the hostfile"), "{err}");
    }
}

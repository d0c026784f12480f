//! N independent servers started together (e.g. the N masters of a Redlock).

use std::ops::{Deref, DerefMut};

use crate::{Error, Server, ServerBuilder};

/// A group of independent servers; index it (`cluster[2].freeze()`) like a slice of [`Server`].
#[derive(Debug)]
pub struct Cluster(Vec<Server>);

impl Cluster {
    /// Starts `n` servers with default options.
    ///
    /// # Panics
    ///
    /// As [`Cluster::try_start_with`] fails.
    pub fn start(n: usize) -> Cluster {
        Cluster::start_with(n, Server::builder())
    }

    /// Starts `n` servers with the same options.
    ///
    /// # Panics
    ///
    /// As [`Cluster::try_start_with`] fails.
    pub fn start_with(n: usize, builder: ServerBuilder) -> Cluster {
        Cluster::try_start_with(n, builder).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Starts `n` servers with the same options, in parallel: every process is spawned first,
    /// then each is awaited. Spawned from the calling thread on purpose: the death signal that
    /// stops them with their parent is tied to the thread that spawns them.
    ///
    /// # Errors
    ///
    /// The first server that does not come up (the ones started are stopped).
    pub fn try_start_with(n: usize, builder: ServerBuilder) -> Result<Cluster, Error> {
        let mut servers = (0..n)
            .map(|_| builder.clone().spawn())
            .collect::<Result<Vec<Server>, Error>>()?;
        for s in &mut servers {
            s.wait_ready_or_retry()?;
        }
        Ok(Cluster(servers))
    }

    /// `redis://127.0.0.1:PORT` of each server.
    pub fn urls(&self) -> Vec<String> {
        self.0.iter().map(Server::url).collect()
    }

    /// `127.0.0.1:PORT` of each server.
    pub fn addrs(&self) -> Vec<String> {
        self.0.iter().map(Server::addr).collect()
    }

    /// The port of each server.
    pub fn ports(&self) -> Vec<u16> {
        self.0.iter().map(Server::port).collect()
    }
}

impl Deref for Cluster {
    type Target = [Server];
    fn deref(&self) -> &[Server] {
        &self.0
    }
}

impl DerefMut for Cluster {
    fn deref_mut(&mut self) -> &mut [Server] {
        &mut self.0
    }
}

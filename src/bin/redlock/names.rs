//! What RESOURCE arguments name: one lock, a set locked all or none, a shared lock's key, the
//! token given back with them, and the permit of a semaphore a token holds.

use std::time::Duration;

use redlock_mux::{Lock, Redlock};

use crate::fail::{Fail, exit};
use crate::options::{HeldLock, LockOptions};
use crate::text::{NAME_SHOWN, shorten};

/// The lock that RESOURCES name: one resource is its own name; several are one set locked all
/// or none (`ResourceSet`), named by its encoding (`redlock:set:…`), which every subcommand
/// takes back as a RESOURCE (`REDLOCK_RESOURCE` of `run` holds it).
pub fn lock_name(resources: &[String], shared: bool) -> Result<String, Fail> {
    match resources {
        [one] if shared => {
            let lock = redlock_mux::Shared::new(one).map_err(|e| Fail::of(&e))?;
            Ok(String::from_utf8_lossy(lock.as_ref()).into_owned())
        }
        _ if shared => Err(Fail::new(
            exit::USAGE,
            "--shared takes one RESOURCE (a shared lock of several is not supported)",
        )),
        [one] => Ok(one.clone()),
        _ => {
            let set = redlock_mux::ResourceSet::new(resources).map_err(|e| Fail::of(&e))?;
            Ok(String::from_utf8_lossy(set.as_ref()).into_owned())
        }
    }
}

/// `RESOURCE TOKEN`, or `RESOURCE RESOURCE... TOKEN` (`more` non-empty: the token is its last
/// word): the lock's name (`lock_name`) and its token.
fn lock_and_token<'a>(
    resource: &str,
    token: &'a str,
    more: &'a [String],
    shared: bool,
) -> Result<(String, &'a str), Fail> {
    let Some((last, between)) = more.split_last() else {
        return Ok((lock_name(&[resource.to_owned()], shared)?, token));
    };
    let mut names = vec![resource.to_owned(), token.to_owned()];
    names.extend(between.iter().cloned());
    Ok((lock_name(&names, shared)?, last))
}

/// With `--permits`: the key of the permit of the semaphore `resource` that `token` holds on
/// most nodes (asked of every permit, each waiting at most `timeout`), for `release` and
/// `extend`; `resource#0` when no node holds it with `token` (the caller then reports it is
/// not held). Without: `resource`.
fn permit_held_by(
    r: &Redlock,
    resource: &str,
    permits: Option<u32>,
    token: &str,
    timeout: Duration,
) -> Result<String, Fail> {
    let Some(permits) = permits else {
        return Ok(resource.to_owned());
    };
    let semaphore = r.semaphore(resource, permits).map_err(|e| Fail::of(&e))?;
    let mut best: Option<(usize, String)> = None;
    for i in 0..permits {
        let key = String::from_utf8_lossy(semaphore.permit_key(i).unwrap_or_default()).into_owned();
        let holding = r
            .status(key.as_bytes(), timeout)
            .iter()
            .filter(|s| s.token() == Some(token.as_bytes()))
            .count();
        if holding > 0 && best.as_ref().is_none_or(|(n, _)| holding > *n) {
            best = Some((holding, key));
        }
    }
    Ok(best.map_or_else(|| format!("{resource}#0"), |(_, key)| key))
}

impl HeldLock {
    /// The lock these arguments give back, on the handle `handle` builds from the lock
    /// options: the handle, the lock's name (with `--permits`, the permit TOKEN holds, asked of
    /// the servers waiting at most `timeout`), and the lock rebuilt with `validity`. The names
    /// are checked before the handle is built, so a bad name is said before a missing server.
    pub fn resolve(
        &self,
        handle: impl FnOnce(&LockOptions) -> Result<Redlock, Fail>,
        timeout: Duration,
        validity: Duration,
    ) -> Result<(Redlock, String, Lock), Fail> {
        let opts = &self.call.opts;
        let (resource, token) =
            lock_and_token(&self.resource, &self.token, &self.more, opts.shared)?;
        let r = handle(opts)?;
        let resource = permit_held_by(&r, &resource, opts.permits, token, timeout)?;
        let lock = Lock::from_parts(resource.as_bytes(), token.as_bytes(), validity)
            .map_err(|e| Fail::of(&e))?;
        Ok((r, resource, lock))
    }
}

impl LockOptions {
    /// The lock that RESOURCES name ([`lock_name`]) for `run` and `acquire`; with `--permits`
    /// there must be one (the semaphore's name); none may be in the reserved namespace (an
    /// encoding given back, such as `run --shared`'s `REDLOCK_RESOURCE`, is for `extend`,
    /// `release` and `status`, not for taking a lock).
    pub fn lock_name(&self, resources: &[String]) -> Result<String, Fail> {
        // A semaphore has one name: several would become a set's (`redlock:set:…`), which the
        // semaphore then refused as a reserved name (a misleading message).
        if self.permits.is_some() && resources.len() > 1 {
            return Err(Fail::new(
                exit::USAGE,
                "--permits takes one RESOURCE (the semaphore's name)",
            ));
        }
        // A name is the user's name, never an encoding: `acquire redlock:shared:job` run twice
        // took two read locks — two holders of what the user believed exclusive. A read lock
        // is `--shared`; several names are one all-or-none lock.
        if let Some(reserved) = resources
            .iter()
            .find(|r| r.starts_with(redlock_mux::RESERVED_PREFIX))
        {
            return Err(Fail::new(
                exit::USAGE,
                format!(
                    "{}: names starting with {:?} are this tool's own keys, not a lock's; a read \
                     lock is --shared (-r) NAME, and several names are one all-or-none lock",
                    shorten(reserved, NAME_SHOWN),
                    redlock_mux::RESERVED_PREFIX
                ),
            ));
        }
        lock_name(resources, self.shared)
    }
}

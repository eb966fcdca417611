use crate::error::Result;
pub(crate) struct Client;
impl Client {
    pub(crate) fn connect_from_env(_t: std::time::Duration) -> Result<Client> { todo!() }
    pub(crate) fn rank(&self) -> usize { 0 }
    pub(crate) fn size(&self) -> usize { 1 }
    pub(crate) fn allgather(&mut self, _d: &[u8]) -> Result<Vec<Vec<u8>>> { todo!() }
    pub(crate) fn close(&mut self) {}
}

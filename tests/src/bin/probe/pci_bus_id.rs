//! Question 12: `cuDeviceGetPCIBusId` and `cuDeviceGetByPCIBusId`. `cuda.h` asks for room for 13
//! characters; the simulator writes `0000:01:00.0` (lowercase hexadecimal, from the PCI
//! attributes) and refuses a shorter buffer rather than cut the string. What does the driver
//! write, and what does it answer for a short buffer and for each form of id?

use std::ffi::{CStr, CString, c_char, c_int};

use cuda_mem_sys::types::CUdevice_attribute;
use cuda_mem_sys::{CudaError, cu_call, driver};

use crate::raw::{code, device_attribute};
use crate::report::Details;
use crate::runner::Setup;
use crate::{Error, Question};

/// The question.
pub(crate) const QUESTION: Question = Question {
    name: "pci-bus-id",
    question: "cuDeviceGetPCIBusId of device 0 (its text; with room for 13, 12 and 1 characters), whether it matches \
               the PCI attributes, and cuDeviceGetByPCIBusId of its forms (full, no function, no domain, upper case)",
    run,
    child: None,
};

fn bus_id(len: c_int) -> Result<String, CudaError> {
    let d = driver()?;
    let mut text = [0 as c_char; 64];
    // SAFETY: `text` has room for 64 bytes; `len` is at most that.
    unsafe { cu_call!(d, cuDeviceGetPCIBusId(text.as_mut_ptr(), len, 0)) }?;
    // SAFETY: the array is zeroed past what the driver wrote, so it is NUL-terminated.
    Ok(unsafe { CStr::from_ptr(text.as_ptr()) }.to_string_lossy().into_owned())
}

fn by_bus_id(text: &str) -> Result<c_int, Error> {
    let d = driver()?;
    let text = CString::new(text)?;
    let mut device: c_int = -1;
    // SAFETY: both pointers are valid.
    unsafe { cu_call!(d, cuDeviceGetByPCIBusId(&mut device, text.as_ptr())) }?;
    Ok(device)
}

fn run(_setup: &Setup<'_>, details: &mut Details) -> Result<String, Error> {
    let full = bus_id(13)?;
    details.put("text", &full);
    for len in [12, 1] {
        let short = bus_id(len);
        details.put(format!("len_{len}"), format!("{} {:?}", code(&short), short.as_deref().unwrap_or("")));
    }
    use CUdevice_attribute as A;
    let from_attributes = format!(
        "{:04x}:{:02x}:{:02x}.0",
        device_attribute(0, A::CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID)?,
        device_attribute(0, A::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID)?,
        device_attribute(0, A::CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID)?
    );
    let matches = from_attributes.eq_ignore_ascii_case(&full);
    details.put("from_attributes", &from_attributes);
    let no_function = full.rsplit_once('.').map_or(full.clone(), |(head, _)| head.to_string());
    let no_domain = full.split_once(':').map_or(full.clone(), |(_, tail)| tail.to_string());
    let mut forms = Vec::new();
    for (name, form) in
        [("full", full.clone()), ("no_function", no_function), ("no_domain", no_domain), ("upper", full.to_uppercase())]
    {
        let found = by_bus_id(&form);
        let shown = match &found {
            Ok(device) => format!("device {device}"),
            Err(e) => e.to_string(),
        };
        details.put(format!("by_bus_id.{name}"), format!("{form:?}: {shown}"));
        forms.push(format!("{name} {shown}"));
    }
    Ok(format!(
        "{full:?} ({} the attributes); room for 12: {}; by id: {}",
        if matches { "matches" } else { "differs from" },
        code(&bus_id(12)),
        forms.join(", ")
    ))
}

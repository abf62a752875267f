// Which cloud's metadata service this machine has, from the firmware's DMI strings alone (no
// request: off a cloud, gpurun never touches the network for preemption notices). The strings
// are those cloud-init's datasources test for:
// - AWS: sys_vendor "Amazon EC2" (Nitro instances), or a bios_version with "amazon" in it (the
//   Xen instances, whose sys_vendor is "Xen");
// - GCP: sys_vendor "Google" or product_name "Google Compute Engine";
// - Azure: sys_vendor "Microsoft Corporation" and product_name "Virtual Machine", which any
//   Hyper-V guest also says, and chassis_asset_tag 7783-7084-3265-9085-8269-3286-77, which
//   only Azure's do (cloud-init's DataSourceAzure).
#pragma once

#include <string>

namespace gpurun {

enum class Cloud { kNone, kAws, kGcp, kAzure };

/// "none", "aws", "gcp", "azure": preemption.watch's words.
const char* cloud_name(Cloud cloud);

/// The DMI directory: $GPURUN_DMI_DIR when set (a test hook: a folder of files named as the
/// kernel's, so that a test can be any cloud), else /sys/class/dmi/id.
inline constexpr const char* kDmiDirVariable = "GPURUN_DMI_DIR";
inline constexpr const char* kDmiDir = "/sys/class/dmi/id";

/// Azure's chassis asset tag.
inline constexpr const char* kAzureAssetTag = "7783-7084-3265-9085-8269-3286-77";

/// The DMI strings read, each trimmed; "" where the file is missing or unreadable.
struct DmiIdentity {
  std::string sys_vendor, product_name, bios_version, chassis_asset_tag;
  /// `"Amazon EC2" / "p4d.24xlarge"`, or "no DMI" when both are empty.
  std::string summary() const;
};

/// Reads the DMI strings of `dir`; never throws.
DmiIdentity read_dmi(const std::string& dir);

/// The cloud these strings name, kNone for any other machine.
Cloud cloud_of(const DmiIdentity& dmi);

}  // namespace gpurun

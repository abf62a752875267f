#include "launch/cloud_detect.h"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <iterator>

namespace gpurun {
namespace {

std::string read_trimmed(const std::string& path) {
  std::ifstream in(path);
  if (!in) return "";
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t begin = text.find_first_not_of(" \t\r\n");
  if (begin == std::string::npos) return "";
  return text.substr(begin, text.find_last_not_of(" \t\r\n") - begin + 1);
}

std::string lower(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return text;
}

}  // namespace

const char* cloud_name(Cloud cloud) {
  switch (cloud) {
    case Cloud::kAws:
      return "aws";
    case Cloud::kGcp:
      return "gcp";
    case Cloud::kAzure:
      return "azure";
    case Cloud::kNone:
      break;
  }
  return "none";
}

std::string DmiIdentity::summary() const {
  if (sys_vendor.empty() && product_name.empty()) return "no DMI";
  return "\"" + sys_vendor + "\" / \"" + product_name + "\"";
}

DmiIdentity read_dmi(const std::string& dir) {
  return {read_trimmed(dir + "/sys_vendor"), read_trimmed(dir + "/product_name"),
          read_trimmed(dir + "/bios_version"), read_trimmed(dir + "/chassis_asset_tag")};
}

Cloud cloud_of(const DmiIdentity& dmi) {
  if (dmi.sys_vendor == "Amazon EC2" || lower(dmi.bios_version).find("amazon") != std::string::npos)
    return Cloud::kAws;
  if (dmi.sys_vendor == "Google" || dmi.product_name == "Google Compute Engine") return Cloud::kGcp;
  if (dmi.sys_vendor == "Microsoft Corporation" && dmi.product_name == "Virtual Machine" &&
      dmi.chassis_asset_tag == kAzureAssetTag)
    return Cloud::kAzure;
  return Cloud::kNone;
}

}  // namespace gpurun

#include "s3/s3_xml.h"

#include <cstring>
#include <memory>
#include <stdexcept>

#include <libxml/parser.h>
#include <libxml/tree.h>

namespace gpurun::s3xml {
namespace {

struct DocFree {
  void operator()(xmlDoc* doc) const { xmlFreeDoc(doc); }
};
using Doc = std::unique_ptr<xmlDoc, DocFree>;

// No network, no entity substitution, no DTD loading (so no XXE); errors are not printed to
// stderr: a malformed answer is reported by the caller.
Doc parse(const std::string& xml) {
  if (xml.empty()) return nullptr;
  return Doc(xmlReadMemory(xml.data(), static_cast<int>(xml.size()), "s3.xml", nullptr,
                           XML_PARSE_NONET | XML_PARSE_NOERROR | XML_PARSE_NOWARNING));
}

bool is(const xmlNode* node, const char* name) {
  return node->type == XML_ELEMENT_NODE &&
         std::strcmp(reinterpret_cast<const char*>(node->name), name) == 0;
}

std::string text_of(const xmlNode* node) {
  xmlChar* content = xmlNodeGetContent(node);
  if (!content) return "";
  std::string text(reinterpret_cast<const char*>(content));
  xmlFree(content);
  return text;
}

// The text of `parent`'s first child element `name`; "" when absent.
std::string child_text(const xmlNode* parent, const char* name) {
  for (const xmlNode* c = parent->children; c; c = c->next)
    if (is(c, name)) return text_of(c);
  return "";
}

// The root element, checked to be `name`. Throws std::runtime_error otherwise.
const xmlNode* root(const Doc& doc, const char* name) {
  const xmlNode* node = doc ? xmlDocGetRootElement(doc.get()) : nullptr;
  if (!node) throw std::runtime_error(std::string("expected XML ") + name + ", got no XML");
  if (!is(node, name))
    throw std::runtime_error(std::string("expected XML ") + name + ", got " +
                             reinterpret_cast<const char*>(node->name));
  return node;
}

std::string unquote(std::string etag) {
  if (etag.size() >= 2 && etag.front() == '"' && etag.back() == '"')
    etag = etag.substr(1, etag.size() - 2);
  return etag;
}

int64_t to_int64(const std::string& text) {
  try {
    return std::stoll(text);
  } catch (const std::exception&) {
    throw std::runtime_error("expected a number, got \"" + text + "\"");
  }
}

std::string escape(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      // Kept as references: a literal CR or LF in element content would be normalised away.
      case '\r':
        out += "&#13;";
        break;
      case '\n':
        out += "&#10;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

}  // namespace

std::optional<ErrorBody> parse_error(const std::string& xml) {
  Doc doc = parse(xml);
  const xmlNode* node = doc ? xmlDocGetRootElement(doc.get()) : nullptr;
  if (!node || !is(node, "Error")) return std::nullopt;
  return ErrorBody{child_text(node, "Code"), child_text(node, "Message"),
                   child_text(node, "Region")};
}

std::string url_decode(const std::string& text) {
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '+') {
      out += ' ';
    } else if (text[i] == '%' && i + 2 < text.size() && hex(text[i + 1]) >= 0 &&
               hex(text[i + 2]) >= 0) {
      out += static_cast<char>(hex(text[i + 1]) * 16 + hex(text[i + 2]));
      i += 2;
    } else {
      out += text[i];
    }
  }
  return out;
}

ListPage parse_list_objects(const std::string& xml) {
  Doc doc = parse(xml);
  const xmlNode* node = root(doc, "ListBucketResult");
  bool encoded = child_text(node, "EncodingType") == "url";
  auto decode = [&](const std::string& text) { return encoded ? url_decode(text) : text; };
  ListPage page;
  page.truncated = child_text(node, "IsTruncated") == "true";
  page.next_token = child_text(node, "NextContinuationToken");
  for (const xmlNode* c = node->children; c; c = c->next) {
    if (is(c, "Contents")) {
      page.objects.push_back(S3Object{decode(child_text(c, "Key")), to_int64(child_text(c, "Size")),
                                      unquote(child_text(c, "ETag"))});
    } else if (is(c, "CommonPrefixes")) {
      page.prefixes.push_back(decode(child_text(c, "Prefix")));
    }
  }
  return page;
}

UploadsPage parse_list_uploads(const std::string& xml) {
  Doc doc = parse(xml);
  const xmlNode* node = root(doc, "ListMultipartUploadsResult");
  bool encoded = child_text(node, "EncodingType") == "url";
  UploadsPage page;
  page.truncated = child_text(node, "IsTruncated") == "true";
  page.next_key_marker = child_text(node, "NextKeyMarker");
  page.next_upload_id_marker = child_text(node, "NextUploadIdMarker");
  if (encoded) page.next_key_marker = url_decode(page.next_key_marker);
  for (const xmlNode* c = node->children; c; c = c->next) {
    if (!is(c, "Upload")) continue;
    std::string key = child_text(c, "Key");
    page.uploads.push_back(S3Upload{encoded ? url_decode(key) : key, child_text(c, "UploadId")});
  }
  return page;
}

std::string parse_upload_id(const std::string& xml) {
  Doc doc = parse(xml);
  std::string id = child_text(root(doc, "InitiateMultipartUploadResult"), "UploadId");
  if (id.empty()) throw std::runtime_error("InitiateMultipartUploadResult without an UploadId");
  return id;
}

std::string parse_complete_etag(const std::string& xml) {
  Doc doc = parse(xml);
  return unquote(child_text(root(doc, "CompleteMultipartUploadResult"), "ETag"));
}

std::vector<DeleteFailure> parse_delete_result(const std::string& xml) {
  Doc doc = parse(xml);
  const xmlNode* node = root(doc, "DeleteResult");
  std::vector<DeleteFailure> failures;
  for (const xmlNode* c = node->children; c; c = c->next) {
    if (is(c, "Error"))
      failures.push_back({child_text(c, "Key"), child_text(c, "Code"), child_text(c, "Message")});
  }
  return failures;
}

std::string complete_body(const std::vector<std::string>& etags) {
  std::string body = "<CompleteMultipartUpload>";
  for (size_t i = 0; i < etags.size(); ++i) {
    body += "<Part><PartNumber>" + std::to_string(i + 1) + "</PartNumber><ETag>" +
            escape(etags[i]) + "</ETag></Part>";
  }
  return body + "</CompleteMultipartUpload>";
}

std::string delete_body(const std::vector<std::string>& keys) {
  std::string body = "<Delete><Quiet>true</Quiet>";
  for (const std::string& key : keys) body += "<Object><Key>" + escape(key) + "</Key></Object>";
  return body + "</Delete>";
}

bool xml_safe(const std::string& key) {
  for (unsigned char c : key)
    if (c < 0x20 && c != '\t' && c != '\n' && c != '\r') return false;
  return true;
}

}  // namespace gpurun::s3xml

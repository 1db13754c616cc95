//! The layout of a rated_usage row, by column name: Python gives the table's insert columns
//! (`RATED_USAGE.insert_columns`) once, at construction, and each is mapped here to where its
//! value comes from, so no column position is written into this crate.

use std::collections::HashMap;

/// A value the sample line itself gives (or the place it was read from).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SampleField {
    EventId,
    Tenant,
    Kind,
    Cluster,
    Node,
    Namespace,
    Pod,
    PodUid,
    Priority,
    Utilization,
    EnergyJoules,
    Labels,
    SourcePartition,
    SourceOffset,
}

impl SampleField {
    fn named(name: &str) -> Option<SampleField> {
        Some(match name {
            "event_id" => SampleField::EventId,
            "tenant" => SampleField::Tenant,
            "kind" => SampleField::Kind,
            "cluster" => SampleField::Cluster,
            "node" => SampleField::Node,
            "namespace" => SampleField::Namespace,
            "pod" => SampleField::Pod,
            "pod_uid" => SampleField::PodUid,
            "priority" => SampleField::Priority,
            "utilization" => SampleField::Utilization,
            "energy_joules" => SampleField::EnergyJoules,
            "labels" => SampleField::Labels,
            "source_partition" => SampleField::SourcePartition,
            "source_offset" => SampleField::SourceOffset,
            _ => return None,
        })
    }
}

/// Where one column's value comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    Sample(SampleField),
    /// A value Python works out for the window or the rating (period, quantity, list_cost,
    /// ...), handed over by name; the number is its place in `RowLayout::given`.
    Given(usize),
}

/// The row's columns in insert order, each with its source.
pub struct RowLayout {
    pub columns: Vec<(String, Source)>,
    given: HashMap<String, usize>,
}

impl RowLayout {
    pub fn new(names: &[String]) -> Result<RowLayout, String> {
        let mut columns = Vec::with_capacity(names.len());
        let mut given = HashMap::new();
        for name in names {
            if columns.iter().any(|(seen, _)| seen == name) {
                return Err(format!("column {name} is named twice"));
            }
            let source = match SampleField::named(name) {
                Some(field) => Source::Sample(field),
                None => {
                    let place = given.len();
                    given.insert(name.clone(), place);
                    Source::Given(place)
                }
            };
            columns.push((name.clone(), source));
        }
        Ok(RowLayout { columns, given })
    }

    /// How many columns take a value Python gives.
    pub fn given_count(&self) -> usize {
        self.given.len()
    }

    /// The place of a given value's column, by the column's name.
    pub fn given_place(&self, name: &str) -> Option<usize> {
        self.given.get(name).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(names: &[&str]) -> Vec<String> {
        names.iter().map(|name| (*name).to_owned()).collect()
    }

    #[test]
    fn sample_columns_and_given_ones_in_insert_order() {
        let layout =
            RowLayout::new(&names(&["tenant", "period", "event_id", "list_cost", "labels"])).expect("layout");
        let sources: Vec<Source> = layout.columns.iter().map(|(_, source)| *source).collect();
        assert_eq!(
            sources,
            [
                Source::Sample(SampleField::Tenant),
                Source::Given(0),
                Source::Sample(SampleField::EventId),
                Source::Given(1),
                Source::Sample(SampleField::Labels),
            ]
        );
        assert_eq!(layout.given_count(), 2);
        assert_eq!(layout.given_place("period"), Some(0));
        assert_eq!(layout.given_place("list_cost"), Some(1));
        assert_eq!(layout.given_place("tenant"), None);
        assert_eq!(layout.given_place("unknown"), None);
    }

    #[test]
    fn a_column_named_twice_is_refused() {
        assert!(RowLayout::new(&names(&["pod", "period", "pod"])).is_err());
        assert!(RowLayout::new(&names(&["period", "period"])).is_err());
    }
}
